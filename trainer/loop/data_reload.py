"""Lightning's ``reload_dataloaders_every_n_epochs=N`` in a fit: when the data hooks run again.

- Training: ``train_dataloader()`` is read at the start of epochs 0, N, 2N, ... (the build's read
  serves epoch 0); each read's dataset replaces the last one and the global-batch plan is remade
  over it (the batch settings and the optimizer steps per epoch stay those of the fit: a reloaded
  loader that changes them is refused, ``trainer/data/reload.py``).
- Validation: ``val_dataloader()`` is read before a validation pass of the fit when N epochs or more
  passed since its last read (Lightning's rule); the read for the sanity pass counts when the
  first epoch validates. Under the mirror's Trainer without a sanity pass, where epoch 0 does not
  validate, the first read itself waits for the first validation (`deferred_val_read`, with or
  without reloads), as in Lightning.
- Every read runs under a seed every rank shares (``trainer.seed`` and the epoch), so the datasets and
  the global batches are the same on any world size.
- Resume: the hooks are read at the build as in any fit; a run resumed inside a reload period reads
  ``train_dataloader()`` again at its first epoch under the seed of that period's first epoch, so a
  loader drawn from the trainer's seeded random numbers is the one the uninterrupted run had (a loader
  built from ``current_epoch`` sees the resumed epoch). Validation reads again at its first pass after
  a resume (as Lightning on a restart).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from trainer.data.reload import reload_train, reload_val
from trainer.loop.run_limits import disables
from trainer.loop.sanity_check import sanity_pass_follows
from trainer.loop.step_limits import plan_fit
from trainer.loop.validation import check_validation_setup

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun


def deferred_val_read(trainer: Any) -> bool:
    """Whether a fit reads ``val_dataloader()`` at its first validation instead of at the build: under
    Lightning's schedule (the mirror's Trainer) where no sanity pass reads it first and epoch 0 does
    not validate (``check_val_every_n_epoch`` > 1), as Lightning reads it (else it reads it as
    training starts, as the build does)."""
    every_epochs = trainer.check_val_every_n_epoch
    return (bool(getattr(trainer, "lightning_val_schedule", False)) and getattr(trainer, "stage", None) == "fit"
            and not sanity_pass_follows(trainer) and every_epochs is not None and every_epochs > 1
            and not disables(trainer.limit_val_batches))


class DataReload:
    """When one fit reads its data hooks again; ``every`` 0: never."""

    def __init__(self, run: RankRun, sanity_read: bool):
        trainer = run.trainer
        self.every: int = getattr(trainer, "reload_dataloaders_every_n_epochs", 0) or 0
        every_n_epochs = getattr(trainer, "check_val_every_n_epoch", None)
        validates_first_epoch = every_n_epochs is None or every_n_epochs == 1
        #: the epoch of the last read of each loader (-inf: none counted)
        self.train_epoch: float = 0
        self.val_epoch: float = 0 if (not sanity_read or validates_first_epoch) else -math.inf
        self.started = False

    def before_epoch(self, run: RankRun) -> None:
        """Read ``train_dataloader()`` again if this epoch is a reload epoch (see the module docstring)."""
        epoch, first = run.epoch, not self.started
        self.started = True
        if not self.every:
            return
        if first and epoch > 0:  # resumed: the reload period's read, under its first epoch's seed
            self.val_epoch = -math.inf
            self.train_epoch = epoch - epoch % self.every
            self._train(run, self.train_epoch)
        elif not first and epoch - self.train_epoch >= self.every:
            self.train_epoch = epoch
            self._train(run, epoch)

    def before_validation(self, run: RankRun) -> None:
        """Read ``val_dataloader()`` before a fit's first validation pass where the build deferred it
        (`deferred_val_read`), or again when it is due."""
        resumed = self.every and self.val_epoch == -math.inf  # (then it reads as on a reload)
        if run.data.val_pending and not resumed:
            run.data.read_pending_val()
            check_validation_setup(run.trainer, run.module, run.data.val_set)
            self.val_epoch = run.epoch
        elif self.every and run.epoch - self.val_epoch >= self.every:
            reload_val(run.data, run.epoch)
            self.val_epoch = run.epoch
            # (as Lightning: the loaders read again count their per-batch rows from 0)
            run.eval_steps_logged = {k: v for k, v in run.eval_steps_logged.items() if k[0] != "validate"}

    def _train(self, run: RankRun, seed_epoch: int) -> None:
        reload_train(run.data, seed_epoch)
        old = run.fit_plan
        new = plan_fit(run.trainer, run.module, run.data.plan(run.data_parallel_size, old.batch), old.batch)
        if new.steps_per_epoch != old.steps_per_epoch:
            raise ValueError(
                f"reload_dataloaders_every_n_epochs: {run.data.hooks.where['train']} at epoch {run.epoch} makes "
                f"{new.steps_per_epoch} optimizer steps per epoch, the fit's first loader {old.steps_per_epoch}: the "
                "epoch length is fixed over a fit here (the stop rule, when to validate and the checkpoints' "
                "positions follow from it); return loaders of the same length, or cap it with limit_train_batches")
        run.replan(old.batch, dataclasses.replace(old, plan=new.plan))
