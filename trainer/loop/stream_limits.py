"""Epoch length and stop rules when the training data is a stream whose length is unknown up front.

The epoch ends where the stream ends. ``max_steps`` and ``max_epochs`` work; settings that need the
epoch's length (a fraction ``limit_train_batches`` or ``val_check_interval``, a progress total, a
schedule sized by ``trainer.estimated_stepping_batches``) are an error naming the setting and the fix,
unless the dataset has ``__len__``, which is then used for those estimates only (never to cut an epoch).
"""

from __future__ import annotations

import math
from typing import Any

from trainer.data.streaming.plan import is_stream
from trainer.loop.run_limits import fraction_of, train_steps_per_epoch, val_interval_steps
from trainer.loop.step_limits import StepLimits, epoch_cap


def _no_length(setting: str, value: Any) -> ValueError:
    return ValueError(
        f"{setting}={value} is a fraction of an epoch, but the training data is a stream without __len__, so the "
        "epoch's length is unknown up front: give an integer number of optimizer steps instead, or give the "
        "dataset __len__ (used for estimates only)"
    )


def epoch_length(trainer: Any, plan: Any) -> tuple[int | float, int | None]:
    """``(steps per epoch at most, val_every_n_steps)`` under ``limit_train_batches`` and a float
    ``val_check_interval``; for a stream the first is ``math.inf`` unless an int limit caps it."""
    if not is_stream(plan):
        steps = train_steps_per_epoch(trainer, plan.steps_per_epoch)
        return steps, val_interval_steps(trainer, steps)
    estimate, limit = plan.estimated_steps, trainer.limit_train_batches
    if isinstance(limit, float) and limit == 1.0:  # every batch: the whole stream
        limit = None
    if isinstance(limit, float) and limit and estimate is None:
        raise _no_length("trainer.limit_train_batches", limit)
    cap = fraction_of(limit, estimate) if isinstance(limit, float) else (math.inf if limit is None else limit)
    if trainer.val_check_fraction is None:
        return cap, trainer.val_every_n_steps
    if estimate is None:
        if trainer.val_check_fraction == 1.0:  # the whole epoch: validation at its end (as Lightning)
            return cap, None
        raise _no_length("trainer.val_check_interval", trainer.val_check_fraction)
    return cap, fraction_of(trainer.val_check_fraction, min(cap, estimate)) or None


def epoch_over(plan: Any, epoch: int, epoch_step: int, steps_per_epoch: int | float) -> bool:
    """Whether the epoch finished (all its steps, or its stream ended), not cut short by a stop."""
    return epoch_step >= steps_per_epoch or (is_stream(plan) and epoch in plan.ended)


def training_batches(plan: Any, steps_per_epoch: int | float) -> int | float:
    """This rank's micro-batches per epoch (Lightning's ``trainer.num_training_batches``): the full steps'
    micro-batches and the last step's (a short last global batch may need fewer); inf for a stream, or
    its cap under an int ``limit_train_batches`` (Lightning's min(inf, limit))."""
    if steps_per_epoch == math.inf:
        return math.inf
    if is_stream(plan):
        return steps_per_epoch * plan.accumulate
    if steps_per_epoch < plan.steps_per_epoch:  # limited: full steps only
        return steps_per_epoch * plan.accumulate
    return (steps_per_epoch - 1) * plan.accumulate + plan.micro_steps(steps_per_epoch - 1)


def describe_epoch(plan: Any, steps_per_epoch: int | float) -> str:
    if not is_stream(plan):
        return f"{steps_per_epoch} steps per epoch"
    about = f", about {plan.estimated_steps} by __len__" if plan.estimated_steps else ""
    cap = f"at most {steps_per_epoch} steps, " if steps_per_epoch != math.inf else ""
    return f"epochs end where the stream does ({cap}unknown length{about})"


def step_limits(trainer: Any, plan: Any, steps_per_epoch: int | float, manual: bool) -> StepLimits:
    return StreamLimits(trainer, plan, steps_per_epoch, manual) if is_stream(plan) else \
        StepLimits(trainer, steps_per_epoch, manual)


class StreamLimits(StepLimits):
    """``StepLimits`` for a stream: ``max_steps`` as usual, ``max_epochs`` counted as epochs end."""

    def __init__(self, trainer: Any, plan: Any, steps_per_epoch: int | float, manual: bool):
        super().__init__(trainer, steps_per_epoch, manual)
        self.max_epochs = epoch_cap(trainer)
        self.sharded = getattr(plan, "mode", None) == "sharded"
        per_epoch = min(steps_per_epoch, plan.estimated_steps or math.inf)
        self.estimate = per_epoch * self.max_epochs if self.max_epochs is not None else math.inf
        if self.max_steps != math.inf:
            self.estimate = min(self.estimate, self.max_steps)

    def estimated_stepping_batches(self, trainer: Any) -> int | str:
        if self.estimate != math.inf and not self.manual:
            return int(self.estimate)
        if self.manual and self.max_steps != math.inf and not self.epoch_bound:
            return int(self.max_steps)
        what = ("a sharded stream (uneven shards: the busiest rank decides an epoch's steps)" if self.sharded
                else "a stream without __len__")
        return (f"trainer.estimated_stepping_batches: the training data is {what}, so the steps of "
                f"trainer.max_epochs={self.max_epochs} epoch(s) are unknown up front; set trainer.max_steps (a schedule "
                "needs its length), or give the dataset __len__")

    def progress_total(self) -> int | None:
        return None if self.estimate == math.inf else int(self.estimate)

    def describe_total(self) -> str:
        parts = [] if self.max_steps == math.inf else [f"{int(self.max_steps)} steps"]
        if self.max_epochs is not None:
            parts.append(f"{self.max_epochs} epoch(s) of the stream")
        return " or ".join(parts) or "no limit"

    def done(self, run: Any) -> bool:
        return super().done(run) or (self.max_epochs is not None and run.epoch >= self.max_epochs)
