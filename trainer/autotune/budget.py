"""The time budget: a candidate is started only if the ones run so far say it can finish.

The estimate for the next candidate is the longest trial so far (start-up included; candidates
differ mostly in start-up and a few steps, so the longest is a safe bound). The first one has no
estimate and is started if any time is left. Every trial also gets the time left as a hard limit
(its process group is killed there), so the search ends within the budget even when the estimate
was wrong: that trial is then a row "failed: stopped at the time budget".
"""

from __future__ import annotations

import os
import time
from typing import Callable

#: Kept back for what follows the last trial: the table, results.json and the best config.
FINISH_MARGIN_S = 5.0


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc), so the budget also covers the
    interpreter's start and the imports; 0 where /proc is not there."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            started_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


class Budget:
    """Seconds for the whole search, counted from ``already_spent`` seconds before construction.

    Args:
        seconds: ``autotune.budget_s``.
        already_spent: time used before the clock started (the process's age).
        clock: a monotonic clock (tests pass a fake one).
        margin_s: kept back at the end (``FINISH_MARGIN_S``).
    """

    def __init__(self, seconds: float, already_spent: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 margin_s: float = FINISH_MARGIN_S):
        self.seconds, self.clock, self.margin_s = seconds, clock, margin_s
        self.start = clock() - already_spent

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds a trial may still use (the finishing margin kept back)."""
        return self.seconds - self.margin_s - self.elapsed()

    @staticmethod
    def estimate(durations: list[float]) -> float:
        """The next trial's expected wall time: the longest so far (0 with none run)."""
        return max(durations, default=0.0)

    def can_start(self, durations: list[float]) -> bool:
        """Whether a trial expected to take ``estimate(durations)`` finishes in the time left."""
        left = self.left()
        return left > 0 and self.estimate(durations) <= left
