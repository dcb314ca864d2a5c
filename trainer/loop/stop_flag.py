"""``trainer.should_stop = True`` from user code on any rank: agreed on every rank at the next logging
step (one tiny all-reduce there; none on other steps), then the run stops there."""

from __future__ import annotations

from typing import Any

from trainer.loop.step_counts import check_equal
from trainer.runtime import distributed

#: the reason the log gives when ``trainer.should_stop = True`` stopped the run
SHOULD_STOP_REASON = "trainer.should_stop was set to True"


class StopFlag:
    """The flag ``trainer.should_stop`` sets on this rank, and its agreement across ranks."""

    def __init__(self) -> None:
        self.requested = False

    def set(self, value: bool, agreed_stop: bool) -> None:
        if not value and agreed_stop:
            raise RuntimeError("trainer.should_stop = False: the ranks already agreed to stop at this step")
        self.requested = value

    def agree(self, callbacks: Any, global_step: int | None = None, step: int = 0) -> None:
        """At the end of a logging step, on every rank: whether any rank set the flag; if one did,
        the stop is requested from ``callbacks`` (a CallbackList) on every rank. With ``global_step``
        (manual optimization), the same all-reduce compares every rank's count, and unequal counts
        raise on every rank, naming the logging step ``step`` (trainer/loop/step_counts.py)."""
        if global_step is None:
            requested = distributed.any_rank(self.requested)
        else:
            requested, counts = distributed.any_rank_and_values(self.requested, global_step)
            check_equal(counts, step)
        if requested:
            callbacks.request_stop(SHOULD_STOP_REASON)
