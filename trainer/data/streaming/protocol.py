"""The shard protocol of streaming (iterable) datasets, and which reader reads which shard.

A ``torch.utils.data.IterableDataset`` MAY define ``n_shards: int`` and
``shard_samples(shard, epoch) -> Iterator[sample]``; ``ShardedIterable`` declares both. A dataset
without them is one shard whose samples are ``iter(dataset)`` (after ``dataset.set_epoch(epoch)``
if it has that method).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset

from trainer.runtime.seeding import derive_seed

MODES = ("invariant", "sharded")


class ShardedIterable(IterableDataset):
    """Base class of a streaming dataset made of shards (the protocol the trainer reads).

    Define ``n_shards`` (an int attribute or property: how many shards there are) and
    ``shard_samples(shard, epoch)``: an iterator over the samples of shard ``shard`` (0 ..
    n_shards - 1) in the order epoch ``epoch`` wants them. The trainer permutes the shard order per
    epoch (seeded from ``trainer.seed``), hands the shards to its readers (data-loader workers,
    and in ``data.stream_mode=sharded`` also ranks) and resumes mid-shard by iterating the shard
    again and skipping the samples already trained on, so ``shard_samples`` must give the same
    samples in the same order every time it is called with the same arguments (draw any shuffle
    from a generator seeded with ``(shard, epoch)``, not from the global one).

    ``__iter__`` (plain iteration outside the trainer) yields every shard in order.
    """

    n_shards: int = 1

    def shard_samples(self, shard: int, epoch: int) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define shard_samples(shard, epoch)")

    def __iter__(self) -> Iterator[Any]:
        for shard in range(self.n_shards):
            yield from self.shard_samples(shard, 0)


def shard_count(dataset: Any) -> int:
    """The dataset's number of shards (1 for a dataset without the protocol)."""
    if not callable(getattr(dataset, "shard_samples", None)):
        return 1
    count = getattr(dataset, "n_shards", None)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{type(dataset).__name__}.n_shards={count!r}: give an integer >= 1 (the number of shards "
                         "that shard_samples(shard, epoch) reads)")
    return count


def shard_samples(dataset: Any, shard: int, epoch: int) -> Iterator[Any]:
    """The samples of one shard for one epoch (the whole dataset for one without the protocol)."""
    if callable(getattr(dataset, "shard_samples", None)):
        return iter(dataset.shard_samples(shard, epoch))
    if callable(getattr(dataset, "set_epoch", None)):
        dataset.set_epoch(epoch)
    return iter(dataset)


def first_sample(dataset: Any, num_shards: int, seed: int, epoch: int) -> Any:
    """The first sample of the epoch's first non-empty shard (padding for a rank that read nothing):
    the same on every rank, so a rank whose shards are empty pads like the others instead of failing."""
    for shard in shard_order(num_shards, seed, epoch):
        for sample in shard_samples(dataset, shard, epoch):
            return sample
    raise ValueError(f"{type(dataset).__name__}: all of its {num_shards} shard(s) are empty in epoch {epoch} "
                     "(shard_samples gave no sample): give the stream at least one sample")


def shard_order(num_shards: int, seed: int, epoch: int) -> list[int]:
    """The epoch's shard order: a permutation seeded from ``(seed, "shards", epoch)``, the same on every rank."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "shards", epoch))
    return torch.randperm(num_shards, generator=generator).tolist()  # CPU: no device sync


def reader_shards(order: list[int], mode: str, rank: int, world: int, reader: int, readers: int) -> list[int]:
    """The shards reader ``reader`` (of ``readers`` per rank) of rank ``rank`` reads, in order.

    invariant: every rank reads all shards, reader w the positions w, w + readers, ...;
    sharded: the positions ``(rank * readers + reader) mod (world * readers)`` (each shard read once in the world)."""
    if mode == "invariant":
        return order[reader::readers]
    return order[rank * readers + reader::world * readers]


def check_enough_shards(num_shards: int, world: int, num_workers: int, where: str) -> None:
    """sharded mode: every reader of the world needs at least one shard."""
    readers = max(num_workers, 1)
    if num_shards < world * readers:
        raise ValueError(
            f"{where}: data.stream_mode=sharded needs at least one shard per reader, but the dataset has n_shards="
            f"{num_shards} for data-parallel world size {world} x {readers} reader(s) per rank (data.num_workers="
            f"{num_workers}; 0 means one reader, the main process) = {world * readers}: give the dataset more shards, "
            "use fewer workers or ranks, or data.stream_mode=invariant"
        )
