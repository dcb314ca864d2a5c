"""The trainer's reader: an IterableDataset around the user's stream that reads one reader's
shards (trainer/data/streaming/protocol.py) and knows its position (for torchdata's StatefulDataLoader).

Its state is ``(epoch, shard cursor, offset in the shard)``; a restored reader calls
``shard_samples`` for the shard again and skips ``offset`` samples by iterating (simple and exact;
costs reading the skipped part of one shard once per resume).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

from torch.utils.data import IterableDataset, get_worker_info

from trainer.data.streaming.protocol import reader_shards, shard_order, shard_samples


class ShardReader(IterableDataset):
    """Yields the samples of the shards of one reader per data-loader worker (or the main process)."""

    def __init__(self, dataset: Any, num_shards: int, mode: str, rank: int, world: int, readers: int,
                 seed: int, epoch: int):
        self.dataset, self.num_shards, self.mode = dataset, num_shards, mode
        self.rank, self.world, self.readers, self.seed, self.epoch = rank, world, readers, seed, epoch
        self.cursor = 0  # index into this reader's shard list
        self.offset = 0  # samples of that shard already yielded

    def my_shards(self) -> list[int]:
        info = get_worker_info()
        reader = info.id if info is not None else 0
        order = shard_order(self.num_shards, self.seed, self.epoch)
        return reader_shards(order, self.mode, self.rank, self.world, reader, self.readers)

    def __iter__(self) -> Iterator[Any]:
        shards = self.my_shards()
        while self.cursor < len(shards):
            samples = shard_samples(self.dataset, shards[self.cursor], self.epoch)
            for sample in itertools.islice(samples, self.offset, None):
                self.offset += 1  # before the yield: the state seen while suspended counts this sample as read
                yield sample
            self.cursor, self.offset = self.cursor + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["epoch"] != self.epoch:
            raise ValueError(f"the stream state belongs to epoch {state['epoch']}, this reader reads epoch {self.epoch}")
        self.cursor, self.offset = state["cursor"], state["offset"]
