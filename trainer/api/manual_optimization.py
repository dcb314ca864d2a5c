"""The module's manual-optimization methods (``self.automatic_optimization = False``, Lightning's
names): ``optimizers()``, ``lr_schedulers()``, ``manual_backward``, ``clip_gradients``,
``no_backward_sync`` and ``toggle_optimizer`` / ``untoggle_optimizer`` / ``toggled_optimizer``. What each does during a fit is the loop's (trainer/loop/manual_step.py, whose
docstring has the rules); here they check where they are called and hand over.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from trainer.api.optimizer import LightningOptimizer


class ManualOptimizationHooks:
    """The module side of manual optimization (mixed into ``TrainModule``; Lightning's names). The
    loop's manual step (trainer/loop/manual_step.py) sets ``_manual_step`` on the module for a fit."""

    #: False: ``training_step`` steps the optimizers itself (see trainer/loop/manual_step.py)
    automatic_optimization: bool = True

    def _manual(self, what: str, inside_step: bool = True) -> Any:
        step = self.__dict__.get("_manual_step")
        if not inside_step and step is not None:  # optimizers() / lr_schedulers(): also under automatic
            return step
        if getattr(self, "automatic_optimization", True):
            raise RuntimeError(f"self.{what} is for manual optimization: set self.automatic_optimization = False "
                               "in the module's __init__ (with automatic optimization the trainer does it)")
        if step is not None and (step.active or not inside_step):
            return step
        where = "inside training_step during Trainer.fit" if inside_step else "during Trainer.fit, after configure_optimizers"
        raise RuntimeError(f"self.{what} can only be called {where}")

    def optimizers(self) -> Any:
        """The optimizers of ``configure_optimizers``, each a
        `LightningOptimizer` (an instance of the optimizer's own class;
        ``.optimizer`` is the torch optimizer): one, or a list when there are several (Lightning's
        shape). Manual optimization: ``step()`` goes through the strategy and precision. Automatic:
        to read (the trainer steps them; their ``step()`` says so)."""
        step = self._manual("optimizers()", inside_step=False)
        return step.optimizers[0] if len(step.optimizers) == 1 else list(step.optimizers)

    def lr_schedulers(self) -> Any:
        """The schedulers of ``configure_optimizers``: None, one, or a list. Under manual optimization
        the module steps them (the trainer never does); under automatic, the trainer does."""
        schedulers = [config.scheduler for config in self._manual("lr_schedulers()", inside_step=False).schedulers]
        return None if not schedulers else schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor) -> None:
        """Backward of this rank's micro-batch mean ``loss``, scaled to the global batch (and by fp16's
        loss scale), with the gradient sync unless inside ``no_backward_sync()``."""
        self._manual("manual_backward()").backward(loss)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients: by their global 2-norm ("norm", the default; returns the norm
        before clipping) or element-wise to ``[-val, val]`` ("value"). ``gradient_clip_val`` None:
        nothing (under automatic optimization, from ``configure_gradient_clipping``: the Trainer's
        ``gradient_clip_val`` / ``gradient_clip_algorithm`` fill in what is left out, and a value
        different from the Trainer's is a MisconfigurationException, as in Lightning)."""
        clipper = self.__dict__.get("_gradient_clipper")  # automatic optimization: configure_gradient_clipping
        if clipper is not None:
            return clipper(optimizer, gradient_clip_val, gradient_clip_algorithm)
        return self._manual("clip_gradients()").clip(optimizer, gradient_clip_val, gradient_clip_algorithm or "norm")

    @contextlib.contextmanager
    def no_backward_sync(self, enabled: bool = True) -> Iterator[None]:
        """Backward passes inside do not sync gradients across ranks (Fabric's name); for hand
        accumulation: the first ``manual_backward`` outside syncs what was accumulated."""
        step = self._manual("no_backward_sync()")
        if not enabled:
            yield
            return
        with step.skip_sync():
            yield

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Lightning's meaning: the parameters of the other optimizers get ``requires_grad=False``
        (those of ``optimizer`` keep their flags; parameters in no optimizer are untouched) until
        `untoggle_optimizer` restores what they were."""
        step = self._manual("toggle_optimizer()", inside_step=False)
        target = _raw(optimizer)
        current = dict(self.named_parameters())  # under FSDP, inside a unit's forward: its gathered copies
        saved: dict[int, tuple[list[torch.Tensor], bool]] = {}
        for opt in step.optimizers:
            for param in _params(opt):
                if id(param) not in saved:
                    saved[id(param)] = (_views(param, step.param_names, current), param.requires_grad)
        for opt in step.optimizers:
            keep = _raw(opt) is target
            for param in _params(opt):
                views, flag = saved[id(param)]
                for view in views:
                    view.requires_grad_(flag if keep else False)
        for param in _params(target):  # a parameter shared with another optimizer keeps its flag
            views, flag = saved[id(param)] if id(param) in saved else ([param], param.requires_grad)
            for view in views:
                view.requires_grad_(flag)
        self.__dict__["_param_requires_grad_state"] = saved

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Restore the ``requires_grad`` flags `toggle_optimizer` changed (those of the
        optimizers other than ``optimizer``)."""
        step = self._manual("untoggle_optimizer()", inside_step=False)
        target = _raw(optimizer)
        saved = self.__dict__.get("_param_requires_grad_state", {})
        current = dict(self.named_parameters())
        for opt in step.optimizers:
            if _raw(opt) is target:
                continue
            for param in _params(opt):
                if id(param) in saved:
                    for view in _views(param, step.param_names, current):
                        view.requires_grad_(saved[id(param)][1])
        self.__dict__["_param_requires_grad_state"] = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """``toggle_optimizer`` on entry, ``untoggle_optimizer`` on exit (Lightning 2.6)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)


def _raw(optimizer: Any) -> Any:
    return optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in _raw(optimizer).param_groups for p in group["params"]]


def _views(param: torch.Tensor, names: dict[int, str], current: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """``param`` (the optimizer's) and, where the module holds another tensor under its name now (a
    sharded strategy's gathered copy inside a forward), that one too: both get the flag."""
    other = current.get(names.get(id(param), ""))
    return [param] if other is None or other is param else [param, other]
