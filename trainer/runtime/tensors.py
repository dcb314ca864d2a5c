"""Tensor helpers the loop and strategies share: moving nested batches, local views of DTensors."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Tensors anywhere in nested lists / tuples / dicts moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded (DTensor) tensor, the tensor itself otherwise (a view: writing
    to it writes to the DTensor)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
