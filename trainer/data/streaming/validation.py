"""Validation on a streaming (iterable) dataset: one rank's batches of one validation pass.

invariant: every rank reads the whole stream, cut into batches of the validation batch size; rank r
takes batches r, r + world, ... (every sample once, no padding). sharded: each rank reads its own
shards (``data.stream_mode=sharded``) in batches. Metrics are reduced as for map-style sets.
A pass holds this rank's validation samples in memory (its share of the set: validation sets are
the small ones); under a lockstep strategy (FSDP) the ranks pad to the busiest one (weight 0).
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset

from trainer.data.loaders import _loading_generators
from trainer.runtime.seeding import derive_seed
from trainer.data.streaming.loader import stream_loader
from trainer.data.streaming.protocol import check_enough_shards, first_sample, shard_count


def val_length(dataset: Any, setting: Any) -> int | float:
    """``len(dataset)``; a stream without ``__len__``: ``math.inf``, and a fraction limit is an error."""
    if not isinstance(dataset, IterableDataset):
        return len(dataset)
    try:
        return len(dataset)
    except TypeError:
        if isinstance(setting, float):
            raise ValueError(f"trainer.limit_val_batches={setting} is a fraction of the validation set, but it is a "
                             "stream without __len__: give an integer (global validation batches), or give the "
                             "dataset __len__") from None
        return math.inf


class StreamValShard:
    """This rank's validation batches from a stream (the loop's ``ValidationShard`` for streams)."""

    is_stream = True

    def __init__(self, data: Any, epoch: int, rank: int, world: int, limit: int | None):
        trainer, dataset = data.trainer, data.val_set
        self.mode, self.rank, self.world, self.strategy = trainer.stream_mode, rank, world, trainer.strategy
        self.batch_size, self.collate_fn = data.val_batch_size, data.val_collate
        num_shards = shard_count(dataset)
        if self.mode == "sharded":
            check_enough_shards(num_shards, world, data.val_options.num_workers, type(dataset).__name__)
        source = SimpleNamespace(
            dataset=dataset, num_shards=num_shards, mode=self.mode, rank=rank, world=world, seed=trainer.seed,
            options=data.val_options, loader_seed=lambda e: derive_seed(trainer.seed, "val", "stream", e,
                                                                       rank if self.mode == "sharded" else 0))
        self.pin_memory = data.val_options.pin_memory
        loader = stream_loader(source, epoch)
        # Read under seeded generators put back after (without workers the reader runs in this process):
        # a reader drawing from the global generators does not shift the training's random stream.
        with _loading_generators(derive_seed(trainer.seed, "val", "stream-read", epoch, rank if self.mode == "sharded" else 0)):
            self._read(loader, dataset, num_shards, trainer.seed, epoch, limit)

    def _read(self, loader: Any, dataset: Any, num_shards: int, seed: int, epoch: int, limit: int | None) -> None:
        rank, world = self.rank, self.world
        samples = iter(loader)
        if limit is not None:  # the first samples of the stream (sharded: of each rank's stream, its share)
            samples = itertools.islice(samples, limit if self.mode == "invariant" else -(-limit // world))
        self.batches: list[list[Any]] = []
        self.total_batches = 0
        for index, batch in enumerate(iter(lambda: list(itertools.islice(samples, self.batch_size)), [])):
            self.total_batches += 1
            if self.mode == "sharded" or index % world == rank:
                self.batches.append(batch)
            self.first = batch[0] if index == 0 else getattr(self, "first", None)
        if getattr(self, "first", None) is None:  # nothing read on this rank: a sample to pad with
            self.first = first_sample(dataset, num_shards, seed, epoch)
        self.real, self.padding = len(self.batches), 0

    def __len__(self) -> int:
        return self.real + self.padding

    def sizes(self) -> list[int]:
        return [len(batch) for batch in self.batches] + [0] * self.padding

    def busiest(self) -> int:
        """The most batches a rank has (for lockstep padding): known from the stream in invariant
        mode; one small all-reduce in sharded mode (each rank read only its own shards)."""
        if self.mode == "invariant":
            return -(-self.total_batches // self.world)
        return int(self.strategy.all_reduce_max(torch.tensor([self.real], device=self.strategy.device)).item())

    def padded(self, total: int) -> StreamValShard:
        self.padding = max(0, total - self.real)
        return self

    def __iter__(self) -> Iterator[Any]:
        for batch in self.batches:
            yield pin_batch(self.collate_fn(batch), self.pin_memory)
        for _ in range(self.padding):
            yield pin_batch(self.collate_fn([self.first]), self.pin_memory)  # weight 0


def pin_batch(batch: Any, pin_memory: bool) -> Any:
    """``batch`` in page-locked memory with ``pin_memory`` on a CUDA machine (as a DataLoader pins it)."""
    if not (pin_memory and torch.cuda.is_available()):
        return batch
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin(batch)
