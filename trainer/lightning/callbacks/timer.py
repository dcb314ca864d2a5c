"""Lightning's ``Timer(duration, interval, verbose)`` over this trainer's `Timer`."""

from __future__ import annotations

from typing import Any

from trainer.api.callback import run_of
from trainer.callbacks import Timer as _Timer


class Timer(_Timer):
    """Lightning's ``Timer``: stops training once it has run for ``duration`` ("DD:HH:MM:SS", a
    timedelta or a dict of timedelta arguments), checked after every step (``interval="step"``) or at
    the end of each training epoch (``interval="epoch"``); the ranks' clocks are agreed after each check."""

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True):
        if duration is None:
            raise ValueError("Timer(duration=None) only measures time under Lightning; this Timer stops a run: give "
                             "duration= ('DD:HH:MM:SS', a timedelta or {'hours': ...}), or remove the callback")
        if interval not in ("step", "epoch"):
            raise ValueError(f"Timer(interval={interval!r}): give 'step' or 'epoch'")
        super().__init__(max_time=duration, check_every_n_steps=1)
        self.interval = interval
        self._checked_epoch = False  # an epoch-end check happened: the next stop decision is agreed
        self.verbose = verbose  # the stop reason is always logged (rank 0)

    def stop_needs_agreement(self, step: int) -> bool:
        if self.interval == "step":
            return super().stop_needs_agreement(step)
        pending, self._checked_epoch = self._checked_epoch, False
        return pending

    def on_train_step_end(self, trainer: Any, module: Any, step: int, metrics: dict[str, float] | None) -> None:
        if self.interval == "step":
            super().on_train_step_end(trainer, module, step, metrics)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.interval == "epoch":
            self._checked_epoch = True
            if self.elapsed() >= self.max_time_s:
                run_of(trainer).request_stop(self._reason())
