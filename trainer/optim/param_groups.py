"""Loading an optimizer's state without replacing its param-group dicts (ZeRO-1 shares them with
the user's optimizer, where a scheduler writes the learning rate). Used by the checkpoints and by
ZeRO-1's own state loading, which is why it lives in neither package."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def keep_param_group_dicts(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """``Optimizer.load_state_dict`` replaces the param-group dicts; keep the original dict objects
    (ZeRO-1 shares them with the user's optimizer, where the scheduler writes the learning rate)
    and copy the loaded values into them. ``optimizer`` may be a list (manual optimization)."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    kept = [o.param_groups for o in optimizers]
    yield
    for groups, one in zip(kept, optimizers):
        for old, new in zip(groups, one.param_groups):
            old.update({k: v for k, v in new.items() if k != "params"})
        one.param_groups = groups
