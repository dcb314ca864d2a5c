"""Properties of Lightning's ``Trainer`` that read the run as Lightning names it (a mixin of the
mirror's ``Trainer``, ``trainer.py``):

- ``lightning_module``: the module being run (not the strategy's wrapper: ``trainer.model``);
- ``estimated_stepping_batches``: ``max_steps`` as soon as the Trainer is built when ``max_steps``
  alone bounds the run (Lightning's answer; no data read), else the core Trainer's (known once fit
  has read the data).
"""

from __future__ import annotations

from typing import Any

from trainer.trainer import Trainer as _Trainer


class LightningRunProperties:
    """``lightning_module`` and ``estimated_stepping_batches`` (see the module)."""

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
