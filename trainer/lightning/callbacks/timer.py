"""Lightning's ``Timer(duration, interval, verbose)`` over this trainer's `Timer`."""

from __future__ import annotations

from typing import Any

from trainer.callbacks import Timer as _Timer


class Timer(_Timer):
    """Lightning's ``Timer``: stops training once it has run for ``duration`` ("DD:HH:MM:SS", a
    timedelta or a dict of timedelta arguments), checked after every step (``interval="step"``)."""

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True):
        if duration is None:
            raise ValueError("Timer(duration=None) only measures time under Lightning; this Timer stops a run: give "
                             "duration= ('DD:HH:MM:SS', a timedelta or {'hours': ...}), or remove the callback")
        if interval != "step":
            raise ValueError(f"Timer(interval={interval!r}): this trainer checks the time after optimizer steps; "
                             "use interval='step'")
        super().__init__(max_time=duration, check_every_n_steps=1)
        self.verbose = verbose  # the stop reason is always logged (rank 0)
