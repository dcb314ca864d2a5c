"""The module's optimization hooks: the optimizer and schedulers it trains with
(``configure_optimizers``) and the hooks that replace what the trainer does in an optimizer step under
automatic optimization (``backward``, ``optimizer_step``, ``optimizer_zero_grad``,
``configure_gradient_clipping``, ``lr_scheduler_step``; their defaults do what the trainer does).
A mixin of `TrainModule` (manual optimization:
``trainer/api/manual_optimization.py``)."""

from __future__ import annotations

from typing import Any

import torch


class OptimizationHooks:
    """The optimizer a module builds and the steps of its update it may take over (TrainModule's)."""

    def configure_optimizers(self) -> Any:
        """The optimizer and its learning-rate schedulers. Return one of (Lightning's single-optimizer shapes):

        - ``optimizer``
        - ``(optimizer, scheduler)`` (``scheduler`` None: no scheduler)
        - ``[optimizer]``
        - ``([optimizer], [scheduler, ...])``
        - ``{"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val/loss"}`` (``lr_scheduler``
          and ``monitor`` optional; ``monitor`` is for a bare ``ReduceLROnPlateau``), or ``[that dict]``

        where ``optimizer`` is a ``torch.optim.Optimizer`` and each ``scheduler`` is a torch
        ``LRScheduler`` / ``ReduceLROnPlateau`` built on it, or a dict (every key but "scheduler" optional)::

            {"scheduler": scheduler,
             "interval": "step",      # or "epoch": step after every `frequency` optimizer steps / finished epochs
                                      # (an epoch cut short by max_steps or a stop is none); default "step"
                                      # (Lightning's is "epoch"); not used by ReduceLROnPlateau (one warning)
             "frequency": 1,          # an integer >= 1
             "monitor": "val/loss",   # ReduceLROnPlateau only (and required): a "val/..." metric steps it at
                                      # validation ends, a "train/..." metric at logging steps, a self.log
                                      # name where it is reduced; `frequency` counts those events. A monitor
                                      # missing there is an error ...
             "strict": True,          # ... or, with False, that event is skipped (one warning); ReduceLROnPlateau only
             "name": None,            # LearningRateMonitor logs "{name}/group{i}" instead of "lr/group{i}"
             "reduce_on_plateau": ...}  # True exactly for ReduceLROnPlateau (the default says so)

        A step skipped for an fp16 gradient overflow does not step or count for the schedulers.
        Several optimizers (a list of them, ``([opt, ...], [sched, ...])`` or a list of optimizer
        dicts) need ``self.automatic_optimization = False``; the module then steps the schedulers
        itself. Anything else is an error naming what was given. The default uses the factories
        given to ``__init__`` (the Hydra ``optimizer`` and ``scheduler`` groups); an override that is given a factory and never uses it
        (``self.optimizer_factory``) is an error, since the group's settings would be ignored."""
        if self.optimizer_factory is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer: pass optimizer=... to TrainModule.__init__ "
                "or override configure_optimizers()"
            )
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        return optimizer, self.scheduler_factory(optimizer)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of ``loss`` (already weighted for the global batch and scaled for fp16)."""
        loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """Step ``optimizer``: ``optimizer_closure`` runs the last micro-batch's ``training_step`` and
        backward, ``on_before_optimizer_step`` and the clipping; it must be called (by
        ``optimizer.step(closure=optimizer_closure)``, or before a custom step)."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients (after the first micro-batch's forward of a step, as Lightning)."""
        optimizer.zero_grad()

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip before the step (``Trainer(gradient_clip_val=...)``'s values); default: ``self.clip_gradients``."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm or "norm")

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one scheduler (``metric``: the monitored value of a ReduceLROnPlateau, else None)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)
