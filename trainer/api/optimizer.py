"""What ``self.optimizers()`` returns: `LightningOptimizer` (Lightning's name and meaning).

It is an instance of the wrapped optimizer's own class (``isinstance(opt, torch.optim.Adam)`` holds
for a wrapped Adam): each wrapped class gets a subclass ``Lightning<Name>`` of both this class and
that class. It owns no optimizer state: ``state``, ``param_groups``, ``defaults``, ``state_dict()``
and anything else are the wrapped optimizer's (``opt.optimizer``). ``step(closure=None, **kwargs)``
goes through the trainer (strategy, precision, step counting) during a fit; outside one it steps the
wrapped optimizer itself.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: the class made for each wrapped optimizer class
_CLASSES: dict[type, type] = {}


class LightningOptimizer:
    """A user's optimizer as ``self.optimizers()`` gives it; also an instance of its class.

    Args:
        optimizer: the torch optimizer (returned by ``configure_optimizers``).
        stepper: what ``step`` calls during a fit: ``stepper(optimizer, closure, kwargs)``, which
            returns what the step returns; None: the wrapped optimizer's own ``step``.
    """

    def __new__(cls, optimizer: torch.optim.Optimizer, stepper: Callable[..., Any] | None = None) -> Any:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"LightningOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        inner = type(optimizer)
        made = _CLASSES.get(inner)
        if made is None:
            made = type(f"Lightning{inner.__name__}", (LightningOptimizer, inner), {"__module__": __name__})
            _CLASSES[inner] = made
        return object.__new__(made)

    def __init__(self, optimizer: torch.optim.Optimizer, stepper: Callable[..., Any] | None = None):
        # Not the optimizer class's __init__: this object holds no state of its own.
        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_stepper", stepper)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer."""
        return self.__dict__["_optimizer"]

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step (Lightning's meaning): ``closure`` (if given) computes the loss and calls
        ``manual_backward``; the optimizer calls it (LBFGS several times) before it updates, after
        which ``on_before_optimizer_step`` runs. Returns what the optimizer's step returns (the
        closure's loss). ``kwargs`` go to the optimizer's ``step``."""
        if closure is not None and not callable(closure):
            raise TypeError(f"optimizer.step(closure=...): the closure must be callable, got {type(closure).__name__}")
        stepper = self.__dict__["_stepper"]
        if stepper is None:
            return self.optimizer.step(closure, **kwargs) if closure is not None else self.optimizer.step(**kwargs)
        return stepper(self.optimizer, closure, kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # ----- everything else is the wrapped optimizer's ---------------------------------------------------
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict) -> None:
        self.optimizer.defaults = value

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def register_step_pre_hook(self, hook: Callable) -> Any:
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def __getattr__(self, name: str) -> Any:  # the wrapped optimizer's other attributes
        if name.startswith("__") or name in ("_optimizer", "_stepper"):
            raise AttributeError(name)
        return getattr(self.__dict__["_optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.optimizer, name, value)  # as if set on the optimizer itself

    def __getstate__(self) -> dict:
        return {"_optimizer": self.optimizer}  # the trainer's stepper does not travel

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "_optimizer", state["_optimizer"])
        object.__setattr__(self, "_stepper", None)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return LightningOptimizer, (self.optimizer,)

    def __repr__(self) -> str:
        return f"LightningOptimizer({self.optimizer!r})"
