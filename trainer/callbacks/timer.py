"""Timer: stop training after a wall-clock budget."""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any, Mapping

from trainer.api.callback import Callback, run_of


def parse_duration(value: Any) -> float:
    """Seconds from ``"DD:HH:MM:SS"`` (leading fields may be left out: ``"HH:MM:SS"``, ``"MM:SS"``),
    a number of seconds, a ``timedelta`` or a mapping of ``timedelta`` arguments (``{"hours": 2}``)."""
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, Mapping):
        try:
            seconds = timedelta(**value).total_seconds()
        except TypeError:
            seconds = None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        fields = value.strip().split(":")
        try:
            numbers = [float(field) for field in fields]
        except ValueError:
            numbers = []
        if 1 <= len(numbers) <= 4 and min(numbers) >= 0:
            # From the right: seconds, minutes, hours, days.
            seconds = sum(n * unit for n, unit in zip(reversed(numbers), (1, 60, 3600, 86400)))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"Timer max_time={value!r}: give a positive duration as 'DD:HH:MM:SS' (e.g. '00:12:00:00'), "
            "seconds, a timedelta or {'hours': ...}"
        )
    return seconds


class Timer(Callback):
    """Stop training once it has run for ``max_time`` (wall clock, from the first step; a resumed
    run counts the time saved in its checkpoint).

    Clocks differ between ranks, so the check is agreed: every ``check_every_n_steps`` steps each
    rank compares its own time with the budget and all stop together if any is over (one tiny
    all-reduce on those steps only). Training then ends as usual: final validation, ``save_last``.

    Args:
        max_time: "DD:HH:MM:SS" (e.g. "00:12:00:00" for 12 hours; "HH:MM:SS" and "MM:SS" work too),
            seconds, a timedelta or a dict like ``{"hours": 12}``.
        check_every_n_steps: steps between checks; the run may overshoot ``max_time`` by up to this
            many steps. None: on logging steps (``trainer.log_every_n_steps``), which sync the host
            with the device anyway.
    """

    def __init__(self, max_time: Any = "00:01:00:00", check_every_n_steps: int | None = None):
        if check_every_n_steps is not None and (
            isinstance(check_every_n_steps, bool) or not isinstance(check_every_n_steps, int) or check_every_n_steps < 1
        ):
            raise ValueError(f"Timer check_every_n_steps must be None or an integer >= 1, got {check_every_n_steps!r}")
        self.max_time_s = parse_duration(max_time)
        self.check_every_n_steps = check_every_n_steps
        self._every = check_every_n_steps or 1
        self._restored_s = 0.0  # training time of the runs before a resume
        self._started: float | None = None

    def elapsed(self) -> float:
        """Seconds of training so far (this rank's clock), including the time before a resume."""
        running = time.monotonic() - self._started if self._started is not None else 0.0
        return self._restored_s + running

    def remaining(self) -> float:
        """Seconds left of ``max_time`` (negative once over)."""
        return self.max_time_s - self.elapsed()

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        self._every = self.check_every_n_steps or trainer.log_every_n_steps
        self._started = time.monotonic()
        if self._restored_s >= self.max_time_s:  # restored from rank 0's checkpoint: the same on every rank
            run_of(trainer).request_stop(self._reason())

    def stop_needs_agreement(self, step: int) -> bool:
        return step % self._every == 0

    def on_train_step_end(self, trainer: Any, module: Any, step: int, metrics: dict[str, float] | None) -> None:
        if step % self._every == 0 and self.elapsed() >= self.max_time_s:
            run_of(trainer).request_stop(self._reason())

    def _reason(self) -> str:
        return f"max_time {timedelta(seconds=self.max_time_s)} reached ({self.elapsed():.1f} s of training)"

    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self.elapsed()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored_s = float(state["elapsed_s"])
