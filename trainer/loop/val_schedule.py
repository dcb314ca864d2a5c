"""When ``fit`` validates: after a step (``val_every_n_steps`` / ``val_check_interval``) and at an
epoch's end (``check_val_every_n_epoch``, or a stop that ended the epoch), by one of two rules.

- This trainer's (`trainer.Trainer`): the interval counts the run's steps across epochs (step 30 of
  a 25-step epoch schedule validates every 10: steps 10, 20, 30 ...); every N-th epoch's end
  validates as well (``check_val_every_n_epoch=N``), and ``fit``'s end does when its last step was
  not validated.
- Lightning's (``trainer.lightning_val_schedule``: the mirror's ``Trainer``): with
  ``check_val_every_n_epoch=N`` the interval counts the steps within each epoch, and only in every
  N-th epoch: a fraction 0.3 of a 19-step epoch validates after that epoch's steps 5, 10 and 15,
  and nothing more at the epoch's end. An epoch's end validates only where no interval is set (once
  per epoch) or where a stop ended the epoch; ``fit``'s end does not. With
  ``check_val_every_n_epoch=None`` the interval counts across epochs, as this trainer's.

Both count global batches (optimizer steps), so a schedule is the same on any world size.
"""

from __future__ import annotations

from typing import Any

from trainer.loop.run_limits import disables


class ValSchedule:
    """The validation points of one fit, from the Trainer's settings and the resolved interval
    ``every`` (steps; None: no interval) over epochs of ``steps_per_epoch`` steps."""

    def __init__(self, trainer: Any, every: int | None, steps_per_epoch: int | float):
        self.every = every
        self.every_epochs: int | None = trainer.check_val_every_n_epoch
        #: Lightning's rule (see the module docstring): the interval counts within each epoch
        self.in_epoch = bool(getattr(trainer, "lightning_val_schedule", False)) and self.every_epochs is not None
        if self.in_epoch and every and every > steps_per_epoch and not disables(trainer.limit_val_batches):
            raise ValueError(
                f"trainer.val_check_interval={every} must be less than or equal to the number of the training "
                f"batches ({steps_per_epoch} optimizer steps per epoch): with check_val_every_n_epoch="
                f"{self.every_epochs} it counts the steps of each epoch; to validate every {every} steps across "
                "epochs set check_val_every_n_epoch=None, to turn validation off limit_val_batches=0")

    def epoch_due(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) is one that validates under ``check_val_every_n_epoch``."""
        return self.every_epochs is None or (epoch + 1) % self.every_epochs == 0

    def after_step(self, step: int, epoch: int, epoch_step: int) -> bool:
        """Whether to validate after the step that made the run's ``step`` (the epoch's ``epoch_step``);
        only asked when an interval is set."""
        if self.in_epoch:
            return epoch_step % self.every == 0 and self.epoch_due(epoch)  # type: ignore[operator]
        return step % self.every == 0  # type: ignore[operator]

    def at_epoch_end(self, epoch: int, stopped: bool) -> bool:
        """Whether the end of ``epoch`` validates (unless its last step just did); ``stopped``: a stop
        (EarlyStopping, ``should_stop``, a Timer) ended it."""
        if self.every_epochs is None:
            return stopped
        if not self.epoch_due(epoch):
            return False
        return not self.in_epoch or stopped or not self.every
