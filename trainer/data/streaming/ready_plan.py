"""The training steps of an iterable of ready batches (a loader that is not a DataLoader, or several
training loaders cycled together): ``StreamPlan`` with one ready batch per micro-batch.

A step takes ``accumulate_grad_batches`` ready batches, on any world size: every rank reads the whole
iterable (the same batches in the same order; its loader must then give the same batches in every
process: a shuffling DataLoader inside draws its order from the generators the trainer seeds alike on
every rank, but a source with a generator of its own must seed it alike), and each rank keeps its own
rows of every batch (``trainer/data/ready_rows.py``), weighted by its share. So a step trains on the
same batches as one process, with the same gradient for a ``training_step`` returning its batch's mean
loss. ``data.stream_mode=sharded`` (each rank its own shards) has no meaning for ready batches and is
refused on several ranks.
"""

from __future__ import annotations

from typing import Any

from trainer.data.batch_plan import MicroBatch, StepPlan
from trainer.data.ready_batches import CycledLoaders
from trainer.data.ready_rows import ready_batch_rows
from trainer.data.streaming.plan import StreamPlan


class ReadyBatchPlan(StreamPlan):
    """One rank's steps over an iterable of ready batches (see the module docstring)."""

    def __init__(self, dataset: Any, trainer: Any, batch: Any, world: int, rank: int, collate_fn: Any, options: Any):
        if trainer.stream_mode == "sharded" and world > 1:
            raise ValueError(
                f"data.stream_mode=sharded with {dataset.where}'s {type(dataset.source).__name__}, an iterable of ready "
                f"batches, on {world} data-parallel ranks: its batches are read whole by every rank, which keeps its "
                "rows of each (there are no shards to share out); use data.stream_mode=invariant (the default)")
        super().__init__(dataset, trainer, batch, world, rank, collate_fn, options)
        self.mode = "invariant"
        self.global_batch_size = self.accumulate  # ready batches per step, on any world size
        self.estimated_steps = self._estimate()
        source = dataset.source
        self.parts = list(source.keys) if isinstance(source, CycledLoaders) else None
        self.where = dataset.where

    def describe_global_batch(self) -> str:
        rows = "" if self.world == 1 else f", each cut by rows over {self.world} ranks (every rank reads them all)"
        return f"{self.accumulate} ready batch(es) per step (accumulate {self.accumulate}{rows}; equal to one process)"

    def _invariant_step(self, batches: list, where: tuple[int, int]) -> StepPlan | None:
        if not batches or (len(batches) < self.global_batch_size and self.drop_last):
            return None
        self._queue.clear()
        micro_batches = []
        for m, batch in enumerate(batches):
            mine, weight = ready_batch_rows(batch, self.rank, self.world, self.parts, self.where)
            micro_batches.append(MicroBatch((m,), weight))
            self._collate([mine], (*where, m, m))
        return StepPlan(tuple(micro_batches), len(batches))
