"""DeepSpeed 0.19's ``WarmupLR``, ``WarmupDecayLR`` and ``WarmupCosineLR`` as torch LR schedulers.

Each computes, for every optimizer step, the learning rate DeepSpeed's ``deepspeed/runtime/lr_schedules.py``
computes (the same expressions, so the same floating-point values). DeepSpeed counts with
``last_batch_iteration``: -1 when built (it then sets the group's lr to the schedule's value at -1, e.g.
``warmup_min_lr``), and +1 at every ``step()`` after an optimizer step. A torch scheduler's ``last_epoch``
is 0 when built and +1 per ``step()``, so here DeepSpeed's iteration is ``last_epoch - 1``: the k-th
optimizer step (k = 0, 1, ...) trains with DeepSpeed's value at iteration k - 1 in both.

Like DeepSpeed: ``warmup_num_steps`` is used as ``max(2, warmup_num_steps)``; the default warm-up is
logarithmic (``warmup_type="log"``). Unlike DeepSpeed, an unknown ``warmup_type`` is an error (DeepSpeed
warns and uses "log").
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)

WARMUP_TYPES = ("log", "linear")


def _check_warmup(where: str, warmup_num_steps: Any, warmup_type: Any) -> None:
    if not isinstance(warmup_num_steps, int) or isinstance(warmup_num_steps, bool) or warmup_num_steps <= 0:
        raise ValueError(f"scheduler.params.warmup_num_steps must be a positive integer ({where}), got {warmup_num_steps!r}")
    if warmup_type not in WARMUP_TYPES:
        raise ValueError(f"scheduler.params.warmup_type={warmup_type!r} ({where}) is not one of {', '.join(WARMUP_TYPES)}")


def _check_total(where: str, total_num_steps: Any, warmup_num_steps: int) -> None:
    if not isinstance(total_num_steps, int) or isinstance(total_num_steps, bool) or total_num_steps < 1:
        raise ValueError(f"scheduler.params.total_num_steps must be an integer >= 1 ({where}), got {total_num_steps!r}")
    if total_num_steps < warmup_num_steps:  # DeepSpeed says the same, as a warning
        log.warning("%s: total_num_steps %d is less than warmup_num_steps %d", where, total_num_steps, warmup_num_steps)


def _per_group(optimizer: torch.optim.Optimizer, value: Any, name: str) -> list:
    """A scalar for every param group, or a list with one value per group (DeepSpeed's ``_format_param``)."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"scheduler.params.{name}: expected {len(optimizer.param_groups)} values (one per "
                             f"param group), got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class WarmupLR(LRScheduler):
    """From ``warmup_min_lr`` to ``warmup_max_lr`` (None: the optimizer's lr) over ``warmup_num_steps``
    steps (log or linear), then constant. DeepSpeed's arguments and defaults."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: float | Sequence[float] = 0.0,
                 warmup_max_lr: float | Sequence[float] | None = None, warmup_num_steps: int = 1000,
                 warmup_type: str = "log", last_epoch: int = -1):
        _check_warmup(type(self).__name__, warmup_num_steps, warmup_type)
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = (None if warmup_max_lr is None else _per_group(optimizer, warmup_max_lr, "warmup_max_lr"))
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        super().__init__(optimizer, last_epoch)

    def _gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            if self.warmup_type == "log":
                return self.inverse_log_warm_up * math.log(iteration + 1)
            return iteration / self.warmup_num_steps
        return 1.0

    def get_lr(self) -> list[float]:
        iteration = self.last_epoch - 1  # DeepSpeed's last_batch_iteration
        if iteration < 0:
            return list(self.min_lrs)
        max_lrs = self.base_lrs if self.max_lrs is None else self.max_lrs  # base_lrs: the lr when built
        gamma = self._gamma(iteration)
        return [low + ((high - low) * gamma) for low, high in zip(self.min_lrs, max_lrs)]


class WarmupDecayLR(WarmupLR):
    """``WarmupLR``'s warm-up, then linear decay to 0 at ``total_num_steps`` (DeepSpeed's; note its
    ``warmup_max_lr`` defaults to 0.001, not to the optimizer's lr)."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int,
                 warmup_min_lr: float | Sequence[float] = 0.0, warmup_max_lr: float | Sequence[float] = 0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_epoch: int = -1):
        _check_warmup(type(self).__name__, warmup_num_steps, warmup_type)
        _check_total(type(self).__name__, total_num_steps, warmup_num_steps)
        self.total_num_steps = total_num_steps
        self.total_steps = total_num_steps  # the schedule's length (trainer/schedules.schedule_length)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_epoch)

    def _gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return super()._gamma(iteration)
        return max(0.0, float(self.total_num_steps - iteration) / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(LRScheduler):
    """The optimizer's lr times a ratio: from ``warmup_min_ratio`` to 1 over ``warmup_num_steps`` (log or
    linear), then a cosine down to ``cos_min_ratio`` at ``total_num_steps`` (held there). The first
    optimizer step trains with lr 0, as in DeepSpeed."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = "log",
                 last_epoch: int = -1):
        _check_warmup(type(self).__name__, warmup_num_steps, warmup_type)
        _check_total(type(self).__name__, total_num_steps, warmup_num_steps)
        self.total_num_steps = total_num_steps
        self.total_steps = total_num_steps  # the schedule's length (trainer/schedules.schedule_length)
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        super().__init__(optimizer, last_epoch)

    def _ratio(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            if self.warmup_type == "log":
                ratio = self.inverse_log_warm_up * math.log(iteration + 1)
            else:
                ratio = iteration / self.warmup_num_steps
            return self.warmup_min_ratio + ratio * (1. - self.warmup_min_ratio)
        real_last_step = iteration - self.warmup_num_steps + 1
        real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        cosine_progress = min(1.0, real_last_step / real_total_steps)
        ratio = (1 + math.cos(math.pi * cosine_progress)) / 2
        return max(0.0, self.cos_min_ratio + (1. - self.cos_min_ratio) * ratio)

    def get_lr(self) -> list[float]:
        iteration = self.last_epoch - 1  # DeepSpeed's last_batch_iteration
        if iteration < 0:
            return [0.0 for _ in self.base_lrs]
        ratio = self._ratio(iteration)
        return [base * ratio for base in self.base_lrs]  # base_lrs: DeepSpeed's org_lrs (the lr when built)


SCHEDULERS = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR)}
