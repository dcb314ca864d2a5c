"""Batches under ``strategy=pipeline``: slicing a batch into microbatches, padding it to the fixed
size the stages exchange, and counting its samples (tensors, dicts, lists and tuples of them)."""

from __future__ import annotations

from typing import Any

import torch


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Samples ``start:stop`` of every tensor in ``batch`` (other leaves unchanged)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: slice_batch(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_batch(v, start, stop) for v in batch)
    return batch


def pad_batch(batch: Any, size: int) -> Any:
    """Repeat the last sample until the batch has ``size`` samples (padding counts with weight 0)."""
    if isinstance(batch, torch.Tensor):
        missing = size - batch.shape[0]
        return batch if missing <= 0 else torch.cat([batch, batch[-1:].expand(missing, *batch.shape[1:])])
    if isinstance(batch, dict):
        return {k: pad_batch(v, size) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pad_batch(v, size) for v in batch)
    return batch


def batch_len(batch: Any) -> int:
    """The number of samples: the first dimension of the first tensor found."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    values = batch.values() if isinstance(batch, dict) else batch
    return next(batch_len(v) for v in values if isinstance(v, (torch.Tensor, dict, list, tuple)))
