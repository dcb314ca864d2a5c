"""What the training state occupies on this rank, counted from the tensors themselves.

Sharded (DTensor) parameters, gradients and optimizer states count only this rank's shard, so
the figures show what ZeRO / FSDP save (fp32 AdamW: 4 + 4 + 8 = 16 bytes per parameter,
divided by the number of ranks that share it), independent of allocator caching or process RSS.
"""

from __future__ import annotations

import torch
from torch import nn


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _local_bytes(tensor: torch.Tensor) -> int:
    tensor = _local(tensor)
    return tensor.numel() * tensor.element_size()


def training_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                         allocated: bool = False) -> dict[str, int]:
    """Bytes held on this rank by ``parameters``, ``gradients`` and ``optimizer`` state, and ``total``.

    ``allocated``: count each distinct storage behind the tensors once, whole, instead of the
    tensors' own elements: what is allocated, FSDP's padded shards and reduce-scatter outputs (whose
    local views are shorter) and DDP's gradient buckets (which the gradients are views of) included.
    """
    params = list(module.parameters())
    seen: set[int] = set()

    def size(tensor: torch.Tensor) -> int:
        if not allocated:
            return _local_bytes(tensor)
        storage = _local(tensor).untyped_storage()
        if storage._cdata in seen:
            return 0
        seen.add(storage._cdata)
        return storage.nbytes()

    counts = {
        "parameters": sum(size(p) for p in params),
        "gradients": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            counts["optimizer"] += sum(size(v) for v in state.values() if isinstance(v, torch.Tensor))
    counts["total"] = sum(counts.values())
    return counts
