"""Clipping each gradient element to ``[-value, value]`` (``gradient_clip_algorithm="value"``).

Element-wise, so each rank clips the part of a gradient it holds (an FSDP shard, a pipeline
stage's parameters, a full replica under DDP) and the result is what one process clipping the full
gradient gets. The global-norm algorithm ("norm") needs the norm over every shard: the strategies'
``clip_grad_norm``.
"""

from __future__ import annotations

from typing import Iterable

import torch

from trainer.runtime.tensors import local_tensor

CLIP_ALGORITHMS = ("norm", "value")


@torch.no_grad()
def clip_grad_values(parameters: Iterable[torch.nn.Parameter], value: float) -> None:
    """Clamp every gradient element of ``parameters`` to ``[-value, value]``, in place."""
    for parameter in parameters:
        if parameter.grad is not None:
            local_tensor(parameter.grad).clamp_(-value, value)
