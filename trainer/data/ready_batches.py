"""A loader that is not a DataLoader: any iterable of ready batches (a list of batches, a wrapper
around a DataLoader, a generator-backed object, one whose ``__len__`` raises ``NotImplementedError`` or
that never ends). Its batches are used as they come, one batch per micro-batch.

The meaning is one process's (Lightning's) on any world size: a training step takes
``accumulate_grad_batches`` of its batches (each weighted alike, as Lightning's loss / accumulation),
the epoch ends where the iterable does (its ``__len__``, where it has one, is the expected length),
and evaluation runs each batch once. On several processes every rank reads the whole iterable:
training keeps each rank's rows of every batch (``trainer/data/streaming/ready_plan.py``), evaluation
deals whole batches to the ranks in turn (rank r runs batches r, r + W, ..., each as one process runs it).

The iterable is read as a stream of one-batch "samples" (``ReadyBatches``, an ``IterableDataset``),
through the streaming plans (``trainer/data/streaming/``) with a micro-batch of 1 and a collate
that unwraps the batch (``first_of``)."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler


class ReadyBatches(IterableDataset):
    """A user's iterable of ready batches, as a stream whose samples are the batches."""

    def __init__(self, source: Any, where: str):
        self.source, self.where = source, where

    def __iter__(self) -> Iterator[Any]:
        return iter(self.source)

    def __len__(self) -> int:
        """The iterable's own length; a ``TypeError`` where it has none (or its ``__len__`` raises
        ``NotImplementedError``): read to its end."""
        try:
            return len(self.source)
        except NotImplementedError:
            raise TypeError(f"{type(self.source).__name__} has no length") from None


class CycledLoaders:
    """Several training loaders (a list, tuple or dict of DataLoaders or other iterables) read together as Lightning's
    ``CombinedLoader(mode="max_size_cycle")``: each batch holds one batch of every loader (in the same
    list / dict shape), the shorter loaders start again when they end, and the pass ends with the
    longest one (its length, where every loader has one)."""

    def __init__(self, loaders: Any):
        self.loaders = loaders
        self.keys = list(loaders) if isinstance(loaders, dict) else list(range(len(loaders)))

    def _each(self) -> list[Any]:
        return [self.loaders[key] for key in self.keys]

    def __len__(self) -> int:
        return max(len(loader) for loader in self._each())

    def __iter__(self) -> Iterator[Any]:
        loaders = self._each()
        iterators = [iter(loader) for loader in loaders]
        ended = [False] * len(loaders)
        while True:
            batch = []
            for i, loader in enumerate(loaders):
                try:
                    batch.append(next(iterators[i]))
                except StopIteration:
                    ended[i] = True
                    if all(ended):
                        return
                    iterators[i] = iter(loader)  # a shorter loader starts again
                    batch.append(next(iterators[i]))
            yield dict(zip(self.keys, batch)) if isinstance(self.loaders, dict) else type(self.loaders)(batch)


def loaders_in_dataset_order(loaders: Any) -> Any | None:
    """``loaders`` (several training loaders) with each DataLoader that shuffles or samples rebuilt to
    read its dataset in order (Lightning's ``overfit_batches``); None when none of them needed it."""
    keys = list(loaders) if isinstance(loaders, dict) else range(len(loaders))
    rebuilt = dict(loaders) if isinstance(loaders, dict) else list(loaders)
    changed = False
    for key in keys:
        loader = loaders[key]
        if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset) \
                and type(loader.sampler) is not SequentialSampler and type(loader.batch_sampler) is BatchSampler:
            rebuilt[key] = DataLoader(
                loader.dataset, batch_size=loader.batch_size, shuffle=False, num_workers=loader.num_workers,
                collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                multiprocessing_context=loader.multiprocessing_context, persistent_workers=loader.persistent_workers,
                prefetch_factor=loader.prefetch_factor if loader.num_workers else None)
            changed = True
    if not changed:
        return None
    return rebuilt if isinstance(loaders, dict) else type(loaders)(rebuilt)


def several_train_loaders(loader: Any) -> bool:
    """Whether ``loader`` is a non-empty list, tuple or dict of loaders (DataLoaders or other iterables):
    as in Lightning, several training loaders, each element one of them."""
    each = list(loader.values()) if isinstance(loader, dict) else loader if isinstance(loader, (list, tuple)) else None
    return bool(each) and all(hasattr(one, "__iter__") and not isinstance(one, (str, bytes)) for one in each)


def batch_length(batch: Any) -> int:
    """The samples of a ready batch, as Lightning reads them for an evaluation mean's weight: the first
    dimension of its first tensor (a 0-d tensor or no tensor at all: 1)."""
    if isinstance(batch, torch.Tensor):
        return batch.size(0) if batch.dim() else 1
    parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for part in parts:
        if isinstance(part, (torch.Tensor, dict, list, tuple)):
            return batch_length(part)
    return 1


def first_of(batches: list) -> Any:
    """The collate of ready batches: a micro-batch is one of them, used as it is."""
    return batches[0]


def is_ready_batches(loader: Any) -> bool:
    """Whether ``loader`` is an iterable other than a DataLoader (a list, tuple or dict of loaders is
    several loaders: see ``several_train_loaders``)."""
    return hasattr(loader, "__iter__") and not isinstance(loader, (DataLoader, str, bytes))
