"""Learning-rate schedules stepped once per optimizer step."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.runtime.value_checks import is_int


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warm-up over ``warmup_steps`` (at most ``total_steps``), then cosine decay to
    ``min_lr_ratio`` of the base learning rate at ``total_steps`` (held there afterwards)."""
    if total_steps < 1:
        raise ValueError(
            f"warmup_cosine needs total_steps >= 1, got {total_steps}; set trainer.max_steps "
            "(or scheduler.total_steps) when training by epochs"
        )
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    warmup_steps = min(warmup_steps, total_steps)  # a short run (e.g. max_steps=10) still works

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    # On the function, not the scheduler: LambdaLR's state dict skips plain functions, so after a
    # resume this still says which length the schedule follows (see ``schedule_length``).
    factor.total_steps = total_steps  # type: ignore[attr-defined]
    return LambdaLR(optimizer, factor)


def schedule_length(scheduler: Any) -> int | None:
    """The number of optimizer steps a learning-rate schedule spans, where it says so
    (``warmup_cosine``'s ``total_steps``, ``OneCycleLR.total_steps``, ``CosineAnnealingLR.T_max``);
    None for schedules without a length. A checkpoint records it, so that resuming with a schedule
    of another length (one tied to ``trainer.max_steps``) is said, not silent."""
    if scheduler is None:
        return None
    for fn in getattr(scheduler, "lr_lambdas", None) or ():
        if isinstance(getattr(fn, "total_steps", None), int):
            return fn.total_steps
    for name in ("total_steps", "T_max"):
        value = getattr(scheduler, name, None)
        if is_int(value):
            return value
    return None
