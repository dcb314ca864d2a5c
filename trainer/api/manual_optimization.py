"""The module's manual-optimization methods (``self.automatic_optimization = False``, Lightning's
names): ``optimizers()``, ``lr_schedulers()``, ``manual_backward``, ``clip_gradients`` and
``no_backward_sync``. What each does during a fit is the loop's (trainer/loop/manual_step.py, whose
docstring has the rules); here they check where they are called and hand over.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


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
        """The optimizers of ``configure_optimizers`` (manual optimization: wrapped, ``step()`` goes through
        the strategy and precision): one, or a list when there are several (Lightning's shape). Under
        automatic optimization the optimizer itself, to read (the trainer steps it)."""
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
                       gradient_clip_algorithm: str = "norm") -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients: by their global 2-norm ("norm", returns the norm before
        clipping) or element-wise to ``[-val, val]`` ("value"). ``gradient_clip_val`` None: nothing."""
        clipper = self.__dict__.get("_gradient_clipper")  # automatic optimization: configure_gradient_clipping
        if clipper is not None:
            return clipper(optimizer, gradient_clip_val, gradient_clip_algorithm)
        return self._manual("clip_gradients()").clip(optimizer, gradient_clip_val, gradient_clip_algorithm)

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
