"""What the training state occupies on this rank, counted from the tensors themselves.

Sharded (DTensor) parameters, gradients and optimizer states count only this rank's shard, so
the figures show what ZeRO / FSDP save (fp32 AdamW: 4 + 4 + 8 = 16 bytes per parameter,
divided by the number of ranks that share it), independent of allocator caching or process RSS.
"""

from __future__ import annotations

import torch
from torch import nn


def _local_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return tensor.numel() * tensor.element_size()


def training_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes held on this rank by ``parameters``, ``gradients`` and ``optimizer`` state, and ``total``."""
    params = list(module.parameters())
    counts = {
        "parameters": sum(_local_bytes(p) for p in params),
        "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            counts["optimizer"] += sum(_local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    counts["total"] = sum(counts.values())
    return counts
