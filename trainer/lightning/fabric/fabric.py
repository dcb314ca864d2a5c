"""Lightning's ``Fabric`` for one process on one device, in full precision: what a loop written for
Fabric needs to run there unchanged, and a LightningModule used with it.

- ``Fabric(accelerator="auto" | "cpu" | "cuda" | "gpu", devices=1, loggers=..., callbacks=...)``:
  the device is the first GPU when ``auto`` finds one, else the CPU; anything that asks for more
  processes, nodes, another strategy, a precision other than 32-bit or plugins is refused with one
  line (use `trainer.lightning.Trainer`, which runs those with the same training on any world size);
- ``setup(module, *optimizers)`` moves the module to the device and attaches it
  (``module.fabric``: its ``self.log`` / ``self.log_dict`` go to Fabric's loggers, ``self.logger``
  / ``self.loggers`` are Fabric's, ``self.clip_gradients`` / ``self.manual_backward`` /
  ``self.optimizers()`` go through Fabric); the module and the optimizers come back as they were
  given (no wrappers: on one device in full precision there is nothing to wrap);
- ``setup_dataloaders`` returns the loaders (batches moved to the device when it is not the CPU);
- ``backward``, ``clip_gradients`` (the optimizer's parameters, by value or by norm), ``log`` /
  ``log_dict`` (every logger's ``log_metrics(metrics=..., step=...)``), ``call`` (a hook on the
  callbacks), ``to_device``, ``print``, ``barrier``, ``launch``, ``autocast`` / ``no_backward_sync``
  (nothing to do on one device in full precision), ``seed_everything``;
- any other Fabric method is an AttributeError naming it and what to use.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

#: Fabric's methods this one does not have -> the line its AttributeError gives
_NOT_HERE = ("this Fabric runs one process on one device in full precision (setup, backward, clip_gradients, "
             "log, log_dict, call, to_device, print); for checkpoints, several processes or mixed precision use "
             "trainer.lightning.Trainer")


class Fabric:
    """Lightning's ``Fabric`` on one process and one device (see the module)."""

    def __init__(self, *, accelerator: Any = "auto", strategy: Any = "auto", devices: Any = "auto",
                 num_nodes: int = 1, precision: Any = None, plugins: Any = None, callbacks: Any = None,
                 loggers: Any = None) -> None:
        _require(strategy in ("auto", "single_device"), "strategy", strategy, "'auto' (one process)")
        _require(devices in ("auto", 1, "1", -1, "-1") or devices == [0], "devices", devices, "1 or 'auto'")
        _require(num_nodes == 1, "num_nodes", num_nodes, "1")
        _require(precision in (None, 32, "32", "32-true"), "precision", precision, "'32-true'")
        _require(plugins is None, "plugins", plugins, "None")
        _require(accelerator in ("auto", "cpu", "cuda", "gpu"), "accelerator", accelerator,
                 "'auto', 'cpu', 'cuda' or 'gpu'")
        if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
            raise RuntimeError(f"Fabric(accelerator={accelerator!r}): no CUDA device is available; use 'cpu' or 'auto'")
        gpu = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
        self._device = torch.device("cuda", 0) if gpu else torch.device("cpu")
        self._callbacks = _as_list(callbacks)
        self._loggers = _as_list(loggers)

    # ----- where it runs ---------------------------------------------------------------------------------
    device = property(lambda self: self._device, doc="The device modules and batches are moved to.")
    global_rank = local_rank = node_rank = property(lambda self: 0, doc="0: one process.")
    world_size = property(lambda self: 1, doc="1: one process.")
    is_global_zero = property(lambda self: True, doc="True: one process.")
    loggers = property(lambda self: list(self._loggers), doc="The loggers given (a list).")

    @property
    def logger(self) -> Any:
        """The first logger (an IndexError without one, as Lightning's)."""
        return self._loggers[0]

    def launch(self, function: Callable | None = None, *args: Any, **kwargs: Any) -> Any:
        """Nothing to start on one process: ``function(self, *args, **kwargs)`` when given."""
        return function(self, *args, **kwargs) if function is not None else None

    # ----- set-up ----------------------------------------------------------------------------------------
    def setup(self, module: torch.nn.Module, *optimizers: torch.optim.Optimizer, move_to_device: bool = True) -> Any:
        """``module`` on the device and attached to this Fabric; ``module`` alone without optimizers,
        else ``(module, *optimizers)``."""
        module = self.setup_module(module, move_to_device=move_to_device)
        if optimizers:
            module.__dict__["_fabric_optimizers"] = list(optimizers)
            return (module, *optimizers)
        return module

    def setup_module(self, module: torch.nn.Module, move_to_device: bool = True) -> torch.nn.Module:
        """``module`` on the device; a LightningModule (and the ones inside it) attached."""
        if move_to_device:
            module = module.to(self._device)
        if hasattr(type(module), "fabric"):
            module.fabric = self
        return module

    def setup_optimizers(self, *optimizers: torch.optim.Optimizer) -> Any:
        """The optimizers as given (one, or a tuple)."""
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def setup_dataloaders(self, *dataloaders: Any, use_distributed_sampler: bool = True,
                          move_to_device: bool = True) -> Any:
        """The loaders as given (one process reads every batch); off the CPU their batches are moved
        to the device as they are read (``move_to_device=False``: left where they are)."""
        wrapped = [_DeviceLoader(loader, self) if move_to_device and self._device.type != "cpu" else loader
                   for loader in dataloaders]
        return wrapped[0] if len(wrapped) == 1 else wrapped

    # ----- a step ----------------------------------------------------------------------------------------
    def backward(self, tensor: torch.Tensor, *args: Any, model: Any = None, **kwargs: Any) -> None:
        """``tensor.backward(*args, **kwargs)``."""
        tensor.backward(*args, **kwargs)

    def clip_gradients(self, module: torch.nn.Module, optimizer: Any, clip_val: float | None = None,
                       max_norm: float | None = None, norm_type: float = 2.0,
                       error_if_nonfinite: bool = True) -> torch.Tensor | None:
        """Clip the gradients of ``optimizer``'s parameters: element-wise to ``[-clip_val, clip_val]``,
        or to a total ``norm_type``-norm of ``max_norm`` (returned: the norm before clipping). One of
        the two, as Lightning's."""
        if (clip_val is None) == (max_norm is None):
            raise ValueError(f"Fabric.clip_gradients(clip_val={clip_val!r}, max_norm={max_norm!r}): give exactly one")
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        if clip_val is not None:
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
            return None
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Nothing to cast in full precision."""
        return contextlib.nullcontext()

    def no_backward_sync(self, module: Any, enabled: bool = True) -> contextlib.AbstractContextManager:
        """Nothing to sync on one process."""
        return contextlib.nullcontext()

    # ----- logging, callbacks, helpers -------------------------------------------------------------------
    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """``log_dict({name: value}, step)``."""
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Every logger's ``log_metrics(metrics=..., step=step)`` (one-element tensors as numbers)."""
        metrics = {name: value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
                   for name, value in metrics.items()}
        for logger in self._loggers:
            logger.log_metrics(metrics=metrics, step=step)

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """``hook_name(*args, **kwargs)`` on each callback that has it, in order."""
        for callback in self._callbacks:
            method = getattr(callback, hook_name, None)
            if callable(method):
                method(*args, **kwargs)

    def to_device(self, obj: Any) -> Any:
        """``obj`` with its tensors (in lists, tuples, dicts; a module) on the device."""
        if isinstance(obj, (torch.Tensor, torch.nn.Module)):
            return obj.to(self._device)
        if isinstance(obj, dict):
            return type(obj)({key: self.to_device(value) for key, value in obj.items()})
        if isinstance(obj, (list, tuple)):
            moved = [self.to_device(value) for value in obj]
            return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
        return obj

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` (one process: rank 0)."""
        print(*args, **kwargs)

    def barrier(self, name: str | None = None) -> None:
        """Nothing to wait for on one process."""

    @staticmethod
    def seed_everything(seed: int | None = None, workers: bool | None = None) -> int:
        """`trainer.lightning.seed_everything`."""
        from trainer.lightning.seed import seed_everything

        return seed_everything(seed, workers=bool(workers))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"Fabric.{name} is not here: {_NOT_HERE}")


class _DeviceLoader:
    """A loader whose batches are moved to the Fabric's device as they are read."""

    def __init__(self, loader: Any, fabric: Fabric):
        self.loader, self._fabric = loader, fabric

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield self._fabric.to_device(batch)


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"Fabric({name}={value!r}): this Fabric runs one process on one device in full precision; "
                         f"give {allowed}, or use trainer.lightning.Trainer for more")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
