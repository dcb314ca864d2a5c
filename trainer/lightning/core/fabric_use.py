"""A LightningModule used with a `trainer.lightning.Fabric` (a mixin of ``LightningModule``):
``fabric.setup(module)`` sets ``module.fabric`` (a weak reference, on the LightningModules inside it
too); while set, ``self.log`` / ``self.log_dict`` send the values to the Fabric's loggers (numbers
and tensors, no nested dicts; ``logger=False``: nowhere), ``self.logger`` / ``self.loggers`` are the
Fabric's, ``self.clip_gradients`` calls ``fabric.clip_gradients``, ``self.manual_backward`` calls
``fabric.backward`` and ``self.optimizers()`` returns the optimizers given to ``fabric.setup``.
Without a Fabric every one of them is the Trainer's (`TrainModule`'s)."""

from __future__ import annotations

import logging
import numbers
import weakref
from typing import Any

import torch

log = logging.getLogger(__name__)

#: ``self.log`` options that have a meaning only under the Trainer (a Fabric logs each value as given)
_TRAINER_ONLY = {"on_step": None, "on_epoch": None, "prog_bar": False, "reduce_fx": "mean", "sync_dist": None,
                 "batch_size": None, "rank_zero_only": False, "add_dataloader_idx": True}


class FabricUse:
    """``fabric`` and the methods that go through it while it is set (see the module)."""

    @property
    def fabric(self) -> Any:
        """The Fabric this module was set up with (None: none)."""
        return self.__dict__.get("_fabric")

    @fabric.setter
    def fabric(self, fabric: Any) -> None:
        for child in self.modules():
            if child is not self and isinstance(child, FabricUse):
                child.fabric = fabric
        if fabric is not None and not isinstance(fabric, weakref.ProxyTypes):
            fabric = weakref.proxy(fabric)
        self.__dict__["_fabric"] = fabric

    @property
    def logger(self) -> Any:
        """The Fabric's first logger (an IndexError without one), else the Trainer's."""
        fabric = self.fabric
        return fabric.logger if fabric is not None else super().logger

    @property
    def loggers(self) -> list[Any]:
        """The Fabric's loggers, else the Trainer's."""
        fabric = self.fabric
        return fabric.loggers if fabric is not None else super().loggers

    def log(self, name: str, value: Any, *args: Any, logger: bool = True, **options: Any) -> None:
        """With a Fabric: ``fabric.log_dict({name: value})`` (see the module); else the Trainer's ``self.log``."""
        if self.fabric is None:
            return super().log(name, value, *args, logger=logger, **options)
        self._log_through_fabric({name: value}, logger, options, args)

    def log_dict(self, dictionary: Any, logger: bool = True, **options: Any) -> None:
        """With a Fabric: ``fabric.log_dict(dictionary)`` (see the module); else the Trainer's ``self.log_dict``."""
        if self.fabric is None:
            return super().log_dict(dictionary, logger=logger, **options)
        self._log_through_fabric(dict(dictionary.items()), logger, options, ())

    def _log_through_fabric(self, metrics: dict[str, Any], logger: bool, options: dict, args: tuple) -> None:
        given = [name for name, value in options.items() if name in _TRAINER_ONLY and value not in (None, _TRAINER_ONLY[name])]
        unknown = [name for name in options if name not in _TRAINER_ONLY]
        if args or unknown:
            raise TypeError(f"self.log under Fabric: unexpected arguments {list(args) + unknown}")
        if given:
            log.warning("self.log(%s) under Fabric: %s only mean something under the Trainer and are ignored "
                        "(Fabric logs each value as given)", sorted(metrics), given)
        if logger is False:
            return
        for name, value in metrics.items():
            if isinstance(value, dict):
                raise ValueError(f"self.log_dict({metrics}) under Fabric: nested dictionaries cannot be logged")
            if not isinstance(value, (numbers.Number, torch.Tensor)):
                raise ValueError(f"self.log({name!r}, {value!r}) under Fabric: `{type(value).__name__}` values cannot "
                                 "be logged; log a number or a tensor")
        self.fabric.log_dict(metrics=metrics)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> Any:
        """With a Fabric: ``fabric.clip_gradients`` ("value": ``clip_val``, else ``max_norm``); else the Trainer's."""
        fabric = self.fabric
        if fabric is None:
            return super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        by_value = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value"
        return fabric.clip_gradients(self, optimizer, clip_val=gradient_clip_val if by_value else None,
                                     max_norm=None if by_value else gradient_clip_val)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """With a Fabric: ``fabric.backward(loss)``; else the Trainer's."""
        if self.fabric is None:
            return super().manual_backward(loss, *args, **kwargs)
        self.fabric.backward(loss, *args, **kwargs)

    def optimizers(self, *args: Any, **kwargs: Any) -> Any:
        """With a Fabric: the optimizers given to ``fabric.setup`` (one, or a list); else the Trainer's."""
        if self.fabric is None:
            return super().optimizers(*args, **kwargs)
        optimizers = self.__dict__.get("_fabric_optimizers", [])
        return optimizers[0] if len(optimizers) == 1 else list(optimizers)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_fabric", None)  # (a weak reference to the Fabric of this process)
        return state
