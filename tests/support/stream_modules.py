"""A streaming (iterable) test module: uneven shards whose samples carry their own id (tests/multiprocess/data/test_streaming.py)."""

from __future__ import annotations

import json
import os
import random

import torch

from tests.support.helpers import CheckpointedRegressor, regression_data
from trainer import ShardedIterable

SIZES = (7, 13, 4, 11, 9, 6)  # 50 samples in 6 uneven shards
VAL_SIZES = (5, 9, 3, 8)  # a validation stream of 25 samples


class IdShards(ShardedIterable):
    """Shard s holds samples ``start_s .. start_s + size_s - 1`` (their ids), shuffled per epoch
    with a generator seeded from (shard, epoch); a sample is ``{"id", "x", "y"}``."""

    def __init__(self, sizes=SIZES, with_len: bool = False):
        self.sizes, self.n_shards = tuple(sizes), len(sizes)
        self.x, self.y = regression_data(sum(sizes)).tensors
        self.starts = [sum(sizes[:s]) for s in range(len(sizes))]
        if with_len:
            self.__class__ = IdShardsWithLen

    def shard_samples(self, shard, epoch):
        order = list(range(self.sizes[shard]))
        random.Random(1000 * epoch + shard).shuffle(order)  # (no tensor read: the hot-path probe counts those)
        for i in order:
            index = self.starts[shard] + i
            yield {"id": index, "x": self.x[index], "y": self.y[index]}


class IdShardsWithLen(IdShards):
    def __len__(self):
        return sum(self.sizes)


class StreamRegressor(CheckpointedRegressor):
    """``CheckpointedRegressor`` (can die at a step) on ``IdShards``; ``record``: each rank appends
    the ids of every real micro-batch it trains on to ``<run_dir>/ids-<rank>.jsonl`` as ``[epoch, ids]``."""

    def __init__(self, record: bool = False, with_len: bool = False, val: bool = False, **kwargs):
        kwargs.setdefault("dropout", 0.0)  # equal to one process: no per-rank noise
        super().__init__(**kwargs)
        self.record, self.with_len, self.val = record, with_len, val

    def train_dataset(self):
        return IdShards(with_len=self.with_len)

    def val_dataset(self):
        return IdShards(sizes=VAL_SIZES) if self.val else None

    def validation_step(self, batch, batch_idx):
        return super().validation_step((batch["x"], batch["y"]), batch_idx)

    def training_step(self, batch, batch_idx):
        if self.record and self._log_collector._weight:  # not a padding micro-batch (weight 0)
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            with open(os.path.join(self.trainer.run_dir, f"ids-{rank}.jsonl"), "a") as handle:
                handle.write(json.dumps([self.current_epoch, batch["id"].tolist()]) + "\n")
        return super().training_step((batch["x"], batch["y"]), batch_idx)
