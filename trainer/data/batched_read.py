"""Reading a micro-batch in one indexed gather per tensor, where that is known to give exactly what
reading each sample and collating them gives.

``DataLoader`` reads a batch as ``collate_fn([dataset[i] for i in indices])``: one ``__getitem__``
per sample, then ``torch.stack`` per field. For a ``TensorDataset`` (indexing only, not a subclass,
which may override ``__getitem__``), or a ``Subset`` of one (what ``random_split`` returns), with
torch's default collate, the same batch is ``[tensor[indices] for tensor in tensors]``: the same
values, dtypes and shapes, the samples in the same order, and no random number drawn.

A dataset of its own kind reads whole batches through its ``gather_batch(indices)`` (a list of
ints, in the batch's order), which promises to return what ``default_collate([dataset[i] for i in
indices])`` returns, and to draw no random number (the token windows of ``recipes/token_data.py``:
one slice of a memory-mapped file per batch). It is used where the class that defines it also
defines, or inherits unchanged, how a sample is read (a subclass that overrides ``__getitem__`` is
read per sample again), and through ``Subset`` s of such a dataset. Its batch tensors come
from `batch_tensor`, in shared memory in a loader worker as ``default_collate`` makes them.

A collate function of the user's gets the list of samples it was written for (per-sample reads, or
the dataset's own ``__getitems__``, as ``DataLoader`` does), since a batch read cannot give it that list.
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


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor for a batch: in a loader worker, in shared memory (as
    ``default_collate`` makes it there, so the batch is not copied again on its way to the main process)."""
    out = torch.empty(shape, dtype=dtype)
    return out.share_memory_() if get_worker_info() is not None else out


def _defined_by(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in klass.__dict__), None)


def _own_gather(dataset: Any) -> Callable[[list[int]], Any] | None:
    """The dataset's ``gather_batch``, unless a class below the one that defines it changes how a
    sample is read (``__getitem__`` or ``__getitems__``)."""
    owner = _defined_by(type(dataset), "gather_batch")
    if owner is None or not callable(getattr(dataset, "gather_batch", None)):
        return None
    for name in ("__getitem__", "__getitems__"):
        reader = _defined_by(type(dataset), name)
        if reader is not None and not issubclass(owner, reader):
            return None
    return dataset.gather_batch


def _gather_source(dataset: Any) -> tuple[Any, torch.Tensor | None] | None:
    """``(source, index map)`` of a dataset read by gathering rows, or None. The source: a
    ``TensorDataset``'s tensors, or a dataset's own ``gather_batch``; the map: None, or a ``Subset``'s
    indices composed into one int64 map."""
    if type(dataset) is TensorDataset:
        tensors = tuple(dataset.tensors)
        return (tensors, None) if tensors and all(_plain(t) for t in tensors) else None
    gather = _own_gather(dataset)
    if gather is not None:
        return gather, None
    if type(dataset) is Subset:
        inner = _gather_source(dataset.dataset)
        if inner is None:
            return None
        source, inner_map = inner
        try:
            mapping = torch.as_tensor(dataset.indices, dtype=torch.int64).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            return None  # indices torch cannot read as integers: per-sample reads say what is wrong
        size = len(dataset.dataset)
        mapping = torch.where(mapping < 0, mapping + size, mapping)  # a list's negative index, as subset[i] reads it
        return source, (inner_map[mapping] if inner_map is not None else mapping)
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
        return [torch.index_select(t, 0, rows, out=batch_tensor((len(rows), *t.shape[1:]), t.dtype))
                for t in self.tensors]


class OwnGather:
    """Reads the samples at ``indices`` with the dataset's own ``gather_batch`` (through a
    ``Subset``'s index map, when there is one)."""

    __slots__ = ("gather", "mapping")

    def __init__(self, gather: Callable[[list[int]], Any], mapping: torch.Tensor | None):
        self.gather, self.mapping = gather, mapping

    def __call__(self, indices: Sequence[int]) -> Any:
        if self.mapping is not None:
            return self.gather(self.mapping[torch.tensor(indices, dtype=torch.int64)].tolist())
        return self.gather(list(indices))


def batch_reader(dataset: Any, collate_fn: Callable[[list], Any]) -> TensorGather | OwnGather | None:
    """The reader of whole batches of ``dataset`` for ``collate_fn``, where one gather gives what
    per-sample reads and ``collate_fn`` give (and draws no random number); None otherwise."""
    if not collates_by_default(collate_fn):
        return None
    found = _gather_source(dataset)
    if found is None:
        return None
    source, mapping = found
    return TensorGather(source, mapping) if isinstance(source, tuple) else OwnGather(source, mapping)
