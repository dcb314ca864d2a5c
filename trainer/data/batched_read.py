"""Reading a micro-batch in one indexed gather per tensor, where that is known to give exactly what
reading each sample and collating them gives.

``DataLoader`` reads a batch as ``collate_fn([dataset[i] for i in indices])``: one ``__getitem__``
per sample, then ``torch.stack`` per field. For a ``TensorDataset`` (indexing only, not a subclass,
which may override ``__getitem__``), or a ``Subset`` of one (what ``random_split`` returns), with
torch's default collate, the same batch is ``[tensor[indices] for tensor in tensors]``: the same
values, dtypes and shapes, the samples in the same order, and no random number drawn. A collate
function of the user's gets the list of samples it was written for (per-sample reads, or the
dataset's own ``__getitems__``, as ``DataLoader`` does), since a batch read cannot give it that list.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Subset, TensorDataset, default_collate, get_worker_info

from trainer.api.module import TrainModule


def collates_by_default(collate_fn: Callable[[list], Any]) -> bool:
    """Whether ``collate_fn`` is torch's ``default_collate``, directly or as ``TrainModule.collate_fn``'s default."""
    return getattr(collate_fn, "__func__", collate_fn) in (default_collate, TrainModule.collate_fn)


def _plain(tensor: Any) -> bool:
    """A tensor whose rows stacked equal its rows gathered: in CPU memory, dense, contiguous, no
    subclass, no autograd."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cpu" and tensor.layout == torch.strided \
        and tensor.is_contiguous() and not tensor.requires_grad


def _gather_source(dataset: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None] | None:
    """``(tensors, index map)`` of a dataset read by gathering rows, or None: a ``TensorDataset``'s
    tensors (no map), or a ``Subset``'s source with its indices composed into one int64 map."""
    if type(dataset) is TensorDataset:
        tensors = tuple(dataset.tensors)
        return (tensors, None) if tensors and all(_plain(t) for t in tensors) else None
    if type(dataset) is Subset:
        inner = _gather_source(dataset.dataset)
        if inner is None:
            return None
        tensors, inner_map = inner
        try:
            mapping = torch.as_tensor(dataset.indices, dtype=torch.int64).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            return None  # indices torch cannot read as integers: per-sample reads say what is wrong
        size = len(dataset.dataset)
        mapping = torch.where(mapping < 0, mapping + size, mapping)  # a list's negative index, as subset[i] reads it
        return tensors, (inner_map[mapping] if inner_map is not None else mapping)
    return None


class TensorGather:
    """Reads the samples at ``indices`` collated as ``default_collate`` would: one list with one
    tensor per field, each the field's rows at ``indices``, in that order (in a loader worker,
    written into shared memory, as ``default_collate`` does there)."""

    __slots__ = ("tensors", "mapping")

    def __init__(self, tensors: tuple[torch.Tensor, ...], mapping: torch.Tensor | None):
        self.tensors, self.mapping = tensors, mapping

    def __call__(self, indices: Sequence[int]) -> list[torch.Tensor]:
        rows = torch.tensor(indices, dtype=torch.int64)
        if self.mapping is not None:
            rows = self.mapping[rows]
        if get_worker_info() is None:
            return [torch.index_select(t, 0, rows) for t in self.tensors]
        batch = []
        for t in self.tensors:
            out = torch.empty((len(rows), *t.shape[1:]), dtype=t.dtype).share_memory_()
            batch.append(torch.index_select(t, 0, rows, out=out))
        return batch


def batch_reader(dataset: Any, collate_fn: Callable[[list], Any]) -> TensorGather | None:
    """The reader of whole batches of ``dataset`` for ``collate_fn``, where one gather per tensor
    gives what per-sample reads and ``collate_fn`` give (and draws no random number); None otherwise."""
    if not collates_by_default(collate_fn):
        return None
    source = _gather_source(dataset)
    return TensorGather(*source) if source is not None else None
