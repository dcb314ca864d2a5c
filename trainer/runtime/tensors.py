"""Tensor helpers the loop and strategies share: moving nested batches, local views of DTensors."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Tensors anywhere in nested lists / tuples / dicts moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        # (a CPU tensor on a CPU run is already there: ``.to`` would return it too, in ~0.3 us)
        return batch if batch.is_cpu and device.type == "cpu" else batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [move_to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def full_value(value: Any) -> Any:
    """``value`` as a plain tensor where it is a DTensor (a metric of tensor-parallel activations,
    logits sharded on the vocabulary under loss parallel): its whole value, detached. A collective over
    the DTensor's mesh where it is sharded or partial: every rank of that mesh calls it alike. Anything
    else is returned as it is."""
    import sys

    if "torch.distributed.tensor" not in sys.modules:  # nothing made DTensors (and no import for it)
        return value
    from torch.distributed.tensor import DTensor

    return value.detach().full_tensor() if isinstance(value, DTensor) else value


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded (DTensor) tensor, the tensor itself otherwise (a view: writing
    to it writes to the DTensor)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
