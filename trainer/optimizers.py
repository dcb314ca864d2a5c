"""What ``TrainModule.configure_optimizers`` may return, read into (optimizer, scheduler)."""

from __future__ import annotations

from typing import Any

import torch


def split_optimizers(configured: Any) -> tuple[torch.optim.Optimizer, Any]:
    """``(optimizer, scheduler or None)`` from what ``configure_optimizers`` returned."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured, None
    if isinstance(configured, dict):
        optimizer, scheduler = configured.get("optimizer"), configured.get("lr_scheduler")
        if isinstance(scheduler, dict):
            if scheduler.get("interval", "step") != "step":
                raise ValueError(f"lr_scheduler interval {scheduler['interval']!r}: only 'step' is supported")
            scheduler = scheduler["scheduler"]
    elif isinstance(configured, (tuple, list)) and len(configured) == 2:
        optimizer, scheduler = configured
    else:
        raise TypeError(
            f"configure_optimizers returned {type(configured).__name__}; return an optimizer, "
            "(optimizer, scheduler) or {'optimizer': ..., 'lr_scheduler': ...}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"configure_optimizers gave optimizer={optimizer!r}, not a torch.optim.Optimizer")
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError("ReduceLROnPlateau needs a metric; use a per-step scheduler")
    return optimizer, scheduler
