"""A user's ``DataLoader(batch_sampler=...)`` for training: its batches are the global batches.

A batch sampler decides which samples train together (Lightning's LSTM demo keeps each row of a
batch on one text stream from batch to batch, carrying the hidden state along). The trainer keeps
that meaning on any world size: batch k of the epoch is global step k, dealt over the data-parallel
ranks in contiguous parts (rank r always gets the same rows of every batch), so N ranks train as one
process on the same batches. The per-rank micro-batch is then ``batch length / (ranks x
accumulation)``, which must divide; every batch of an epoch has that length but the last, which may be
shorter (a short last global batch, ``drop_last`` as the loader's). The batches are drawn once per epoch
under the trainer's seed (``set_epoch(epoch)`` first, if the batch sampler has one), like a sampler's
stream (``SamplerStream``).
"""

from __future__ import annotations

import operator
from typing import Any

from trainer.data.batch_plan import SamplerStream
from trainer.runtime.seeding import derive_seed, seeded


class BatchSamplerStream(SamplerStream):
    """An epoch's order: the batch sampler's batches, one after another. ``batch_length``: the length
    of its batches (the global batch)."""

    def __init__(self, batch_sampler: Any, dataset_size: int, seed: int, purpose: str, where: str):
        self.sampler, self.dataset_size, self.seed, self.purpose, self.where = batch_sampler, dataset_size, seed, purpose, where
        self._cached: tuple[int, list[int]] | None = None
        batches = self._batches(0)
        self.batch_length = len(batches[0])
        self.length = sum(len(batch) for batch in batches)

    def _batches(self, epoch: int) -> list[list[int]]:
        name = type(self.sampler).__name__
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)
        with seeded(derive_seed(self.seed, self.purpose, "batch_sampler", epoch)):
            try:
                batches = [[operator.index(i) for i in batch] for batch in self.sampler]
            except TypeError:
                raise TypeError(f"{self.where}: the batch_sampler {name} must yield lists of integer indices") from None
        if not batches or not batches[0]:
            raise ValueError(f"{self.where}: the batch_sampler {name} yields no samples in epoch {epoch}")
        length = len(batches[0])
        uneven = [k for k, batch in enumerate(batches[:-1]) if len(batch) != length]
        if uneven or len(batches[-1]) > length or not batches[-1]:
            k = uneven[0] if uneven else len(batches) - 1
            raise ValueError(f"{self.where}: the batch_sampler {name} gave batch {k} of {len(batches[k])} samples after "
                             f"batches of {length}: its batches are the global batches, so all must have one length "
                             "(the last may be shorter)")
        if any(i < 0 or i >= self.dataset_size for batch in batches for i in batch):
            raise ValueError(f"{self.where}: the batch_sampler {name} yielded an index outside the dataset's "
                             f"0..{self.dataset_size - 1}")
        return batches

    def epoch_order(self, epoch: int) -> list[int]:
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        batches = self._batches(epoch)
        order = [i for batch in batches for i in batch]
        if len(batches[0]) != self.batch_length or len(order) != self.length:
            raise ValueError(f"{self.where}: the batch_sampler {type(self.sampler).__name__} gave batches of "
                             f"{len(batches[0])} ({len(order)} samples) in epoch {epoch}, but {self.batch_length} "
                             f"({self.length} samples) in epoch 0; they must stay the same")
        self._cached = (epoch, order)
        return order

    def micro_batch(self, data_parallel_size: int, accumulate: int) -> int:
        """The per-rank micro-batch that makes each batch one global batch (an error if it does not divide)."""
        parts = data_parallel_size * accumulate
        if self.batch_length % parts:
            raise ValueError(
                f"{self.where}: the batch_sampler {type(self.sampler).__name__}'s batches of {self.batch_length} samples "
                f"are the global batches, and {data_parallel_size} data-parallel rank(s) x accumulate_grad_batches "
                f"{accumulate} = {parts} does not divide {self.batch_length}: use a world size and accumulation whose "
                f"product divides it"
            )
        return self.batch_length // parts
