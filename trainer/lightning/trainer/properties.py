"""Properties of Lightning's ``Trainer`` that read the run as Lightning names it (a mixin of the
mirror's ``Trainer``, ``trainer.py``):

- ``lightning_module``: the module being run (not the strategy's wrapper: ``trainer.model``);
- ``state``: ``fn``, ``stage`` and ``status`` as Lightning's enums (``TrainerFn``, ``RunningStage``,
  ``TrainerStatus``: ``trainer.state.fn.value``), each equal to the string the core Trainer gives;
- ``estimated_stepping_batches``: ``max_steps`` as soon as the Trainer is built when ``max_steps``
  alone bounds the run (Lightning's answer; no data read), else the core Trainer's (known once fit
  has read the data);
- ``callback_metrics`` / ``logged_metrics`` after a call: the values as tensors, as Lightning's (a
  number logged becomes a float32 tensor; the core Trainer keeps them as floats).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.lightning.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus
from trainer.trainer import Trainer as _Trainer


class LightningRunProperties:
    """``lightning_module``, ``state``, ``estimated_stepping_batches``, the metrics as tensors (see the module)."""

    @property
    def state(self) -> TrainerState:
        """Lightning's ``trainer.state``: the call (``fn``), what runs now (``stage``), ``status``."""
        fn, stage, status = _Trainer.state.fget(self)
        return TrainerState(_member(TrainerFn, fn), _member(RunningStage, stage), _member(TrainerStatus, status))

    @property
    def callback_metrics(self) -> dict[str, Any]:
        """The core Trainer's ``callback_metrics``; after a call, as tensors."""
        return _as_tensors(_Trainer.callback_metrics.fget(self), self._run_view is None)

    @callback_metrics.setter
    def callback_metrics(self, value: dict[str, Any]) -> None:
        _Trainer.callback_metrics.fset(self, value)

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """The core Trainer's ``logged_metrics``; after a call, as tensors."""
        return _as_tensors(_Trainer.logged_metrics.fget(self), self._run_view is None)

    @logged_metrics.setter
    def logged_metrics(self, value: dict[str, Any]) -> None:
        _Trainer.logged_metrics.fset(self, value)

    @property
    def lightning_module(self) -> Any:
        """The module of the current call (or the last one), unwrapped; None before any."""
        view = self._run_view
        if view is not None and getattr(view._run, "module", None) is not None:
            return view._run.module
        model = self._model
        return getattr(model, "module", model)

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will run (see the module)."""
        if self.max_steps not in (-1, None) and self.max_epochs in (None, -1):
            return self.max_steps
        return _Trainer.estimated_stepping_batches.fget(self)


def _as_tensors(metrics: dict[str, Any], convert: bool) -> dict[str, Any]:
    """``metrics`` with each number a 0-dim tensor (a float32 one for a Python number) when ``convert``."""
    if not convert:
        return metrics
    return {name: torch.tensor(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool)
            else value for name, value in metrics.items()}


def _member(enum: Any, value: str | None) -> Any:
    """``value`` as the member of ``enum`` equal to it (None stays None)."""
    return None if value is None else enum(value)
