"""Loaders that load exactly the batches a plan deals out (``build_loader``), each batch loaded and
collated under a seed keyed by its position in the epoch, with or without worker processes; a batch
of tensors in memory is read in one gather per tensor (``batched_read.py``)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.data.batched_read import batch_reader
from trainer.data.loading_generators import GENERATORS
from trainer.runtime.seeding import _seed_dataloader_worker, derive_seed, seed_everything


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader settings that only change how batches are loaded, not which (a user's
    ``train_dataloader()`` / ``val_dataloader()`` gives them, or ``data.num_workers`` / ``pin_memory``)."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    prefetch_factor: int | None = None
    timeout: float = 0
    multiprocessing_context: Any = None
    pin_memory_device: str = ""


class _Batches:
    """The batch sampler of a loader: ``(seed, indices)`` for each batch of one pass, keyed by the
    batch's position in the epoch and drawn lazily from ``batches`` (a list, or a plan's
    ``RankBatches``); replaced for the next pass when the loader's workers persist. ``seed`` None:
    loading draws no random number (``draws_no_random_numbers``), so no batch needs a seed."""

    def __init__(self, batches: Iterable[Sequence[int]], seed: int | None, first_batch: int):
        self.batches, self.seed, self.first_batch = batches, seed, first_batch

    def __iter__(self) -> Iterator[tuple[int | None, list[int]]]:
        seed = self.seed
        if seed is None:
            for batch in self.batches:
                yield None, list(batch)
            return
        for i, batch in enumerate(self.batches, start=self.first_batch):
            yield derive_seed(seed, "batch", i), list(batch)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


def _init_worker(user_worker_init: Callable[[int], None] | None, worker_id: int) -> None:
    _seed_dataloader_worker(worker_id)
    if user_worker_init is not None:  # the user's, after the trainer seeded the worker
        user_worker_init(worker_id)


@contextlib.contextmanager
def _loading_generators(seed: int) -> Iterator[None]:
    """In the main process: the CPU generators of torch, ``random`` and NumPy seeded with ``seed``
    for the body, then put back (trainer/data/loading_generators.py)."""
    saved = GENERATORS.enter(seed)
    try:
        yield
    finally:
        GENERATORS.exit(saved)


def draws_no_random_numbers(dataset: Any, collate_fn: Callable[[list], Any]) -> bool:
    """Whether loading a batch is known to draw no random number: a ``TensorDataset`` (indexing only,
    not a subclass), a dataset with its own ``gather_batch``, or a ``Subset`` of either, collated by
    torch's ``default_collate`` (directly or as ``TrainModule.collate_fn``'s default): the batches
    read in one gather (``batched_read.py``). Such a
    batch needs no seeded generators: it draws the same with or without them."""
    return batch_reader(dataset, collate_fn) is not None


def _collated(batch: Any) -> Any:
    return batch  # _SeededBatches collates itself, under its seed


class _SeededBatches(Dataset):
    """Loads and collates ``(seed, indices)`` batches with the generators seeded from ``seed``
    (in a worker, its own; in the main process, see ``_loading_generators``): a batch's random
    augmentations depend on its position in the epoch only, not on which worker or process loads
    it, whether there are workers, what the model drew before, or where a resumed run started."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list], Any]):
        self.dataset, self.collate_fn = dataset, collate_fn
        self.getitems = getattr(dataset, "__getitems__", None)
        self.read_batch = batch_reader(dataset, collate_fn)  # None: per sample (or the dataset's __getitems__)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, key: tuple[int | None, list[int]]) -> Any:
        seed, indices = key
        if seed is None:  # loading draws no random number: nothing to seed
            return self._load(indices)
        if torch.utils.data.get_worker_info() is not None:
            seed_everything(seed)
            return self._load(indices)
        saved = GENERATORS.enter(seed)
        try:
            return self._load(indices)
        finally:
            GENERATORS.exit(saved)

    def _load(self, indices: list[int]) -> Any:
        if self.read_batch is not None:
            return self.read_batch(indices)
        getitems, dataset = self.getitems, self.dataset
        return self.collate_fn(getitems(indices) if getitems is not None else [dataset[i] for i in indices])


class InProcessLoader:
    """The batches read in this process, in order: what a ``DataLoader`` without workers and without
    pinned memory does (the batch's indices, then its read and collate), without the per-batch
    machinery it needs for workers, pinning and iterable datasets. Iterable again for each pass."""

    def __init__(self, dataset: _SeededBatches, batch_sampler: _Batches):
        self.dataset, self.batch_sampler = dataset, batch_sampler

    def __iter__(self) -> Iterator[Any]:
        read = self.dataset.__getitems__
        for key in self.batch_sampler:
            yield read(key)

    def __len__(self) -> int:
        return len(self.batch_sampler)


def build_loader(
    dataset: Dataset,
    batches: Iterable[Sequence[int]],
    collate_fn: Callable[[list], Any],
    options: LoaderOptions,
    seed: int,
    first_batch: int = 0,
    reuse: DataLoader | None = None,
) -> DataLoader | InProcessLoader:
    """A loader that loads exactly ``batches`` (lists of indices, or a lazy ``RankBatches``) in order:
    a DataLoader with the given worker and pinning options, or without workers, pinning and a timeout
    (which DataLoader refuses without workers) an ``InProcessLoader`` (the same batches, less work per batch).

    Batch ``first_batch + i`` is loaded and collated with the generators seeded from
    ``(seed, first_batch + i)``, with or without workers (the same draws either way), so a run
    resumed mid-epoch draws the same augmentations, and loading in the main process leaves the
    training's random stream (dropout) alone.
    ``reuse``: the loader this function returned for the previous pass; with persistent workers
    it is given the new batches and returned, so its workers live on.
    """
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"{type(dataset).__name__} is an IterableDataset; the trainer needs a map-style dataset "
            "(__getitem__ + __len__) to keep global batches identical across world sizes"
        )
    workers = options.num_workers > 0
    if reuse is not None and workers and options.persistent_workers:  # (the same dataset and collate each pass)
        sampler = reuse.batch_sampler
        batch_seed = None if reuse.dataset.read_batch is not None else seed  # type: ignore[attr-defined]
        sampler.batches, sampler.seed, sampler.first_batch = batches, batch_seed, first_batch  # type: ignore[union-attr]
        return reuse
    source = _SeededBatches(dataset, collate_fn)
    keyed = _Batches(batches, None if source.read_batch is not None else seed, first_batch)
    if not workers and not options.pin_memory and not options.timeout:  # (a timeout: DataLoader's error)
        return InProcessLoader(source, keyed)
    return DataLoader(
        source,
        batch_sampler=keyed,
        collate_fn=_collated,
        num_workers=options.num_workers,
        pin_memory=options.pin_memory,
        worker_init_fn=functools.partial(_init_worker, options.worker_init_fn) if workers else None,
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=options.prefetch_factor if workers else None,
        persistent_workers=options.persistent_workers and workers,
        timeout=options.timeout,
        multiprocessing_context=options.multiprocessing_context if workers else None,
        pin_memory_device=options.pin_memory_device,
    )
