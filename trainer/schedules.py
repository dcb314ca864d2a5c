"""Learning-rate schedules stepped once per optimizer step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


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

    return LambdaLR(optimizer, factor)
