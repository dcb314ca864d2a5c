"""Validation on a streaming (iterable) dataset: one rank's batches of one validation pass.

invariant: every rank reads the whole stream, cut into batches of the validation batch size; rank r
takes batches r, r + world, ... (every sample once, no padding). sharded: each rank reads its own
shards (``data.stream_mode=sharded``) in batches. Metrics are reduced as for map-style sets.
A pass reads the stream as it goes (one batch at a time in memory; a stream without ``__len__`` is read to
its end, or to ``limit_val_batches``); under a lockstep strategy (FSDP) the ranks pad to the busiest
one (weight 0).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from types import SimpleNamespace
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset

try:
    import numpy as np
except ImportError:  # NumPy is optional
    np = None
from trainer.data.ready_batches import ReadyBatches, batch_length, first_of
from trainer.runtime.seeding import derive_seed
from trainer.data.streaming.loader import stream_loader
from trainer.data.streaming.protocol import check_enough_shards, first_sample, shard_count

log = logging.getLogger(__name__)


def val_length(dataset: Any, setting: Any) -> int | float:
    """``len(dataset)``; a stream without ``__len__``: ``math.inf``, and a fraction limit is an error."""
    if not isinstance(dataset, IterableDataset):
        return len(dataset)
    try:
        return len(dataset)
    except TypeError:
        if isinstance(setting, float) and setting != 1.0:
            raise ValueError(f"trainer.limit_val_batches={setting} is a fraction of the validation set, but it is a "
                             "stream without __len__: give an integer (global validation batches), or give the "
                             "dataset __len__") from None
        return math.inf


class StreamValShard:
    """This rank's validation batches from a stream (the loop's ``ValidationShard`` for streams), read
    as the pass goes: a stream has no length, so ``weighted`` yields ``(weight, batch, real)`` until
    the stream (or ``limit``) ends, and ``real`` (the count of this rank's real batches) is known after."""

    is_stream = True

    def __init__(self, data: Any, epoch: int, rank: int, world: int, limit: int | None, mode: str | None = None):
        trainer, dataset = data.trainer, data.val_set
        if isinstance(dataset, ReadyBatches):  # whole batches dealt in turn: nothing to shard
            mode = "invariant"
        self.mode, self.rank, self.world, self.strategy = mode or trainer.stream_mode, rank, world, trainer.strategy
        self.batch_size, self.collate_fn = data.val_batch_size, data.val_collate
        self.dataset, self.seed, self.epoch, self.limit = dataset, trainer.seed, epoch, limit
        self.num_shards = shard_count(dataset)
        if self.mode == "sharded":
            check_enough_shards(self.num_shards, world, data.val_options.num_workers, type(dataset).__name__)
        self.source = SimpleNamespace(
            dataset=dataset, num_shards=self.num_shards, mode=self.mode, rank=rank, world=world, seed=trainer.seed,
            options=data.val_options, loader_seed=lambda e: derive_seed(trainer.seed, "val", "stream", e,
                                                                       rank if self.mode == "sharded" else 0))
        self.pin_memory = data.val_options.pin_memory
        self.lockstep = False
        self.real = 0
        self.stream_first: Any = None
        # A stream without __len__ read with no limit may never end; the trainer cannot tell an endless
        # one from a long one, so a pass that reads for longer than a collective may wait says so.
        endless_possible = limit is None and math.isinf(val_length(dataset, None))
        self.notice_after_s = trainer.collective_timeout.total_seconds() if endless_possible else None

    def padded_to_the_busiest(self) -> StreamValShard:
        """Run as many forwards as the busiest rank (a lockstep strategy: FSDP): the extra ones re-read
        a sample with weight 0. invariant: every rank sees the whole stream, so it knows; sharded: one
        small all-reduce per batch says whether any rank still has one."""
        self.lockstep = True
        return self

    def _reader_seed(self) -> int:
        return derive_seed(self.seed, "val", "stream-read", self.epoch, self.rank if self.mode == "sharded" else 0)

    def _batches(self) -> Iterator[list[Any]]:
        """The stream's batches (invariant: all of them, as every rank reads; sharded: this rank's), read
        lazily under generators of their own (without workers the reader runs in this process): a reader
        drawing from the global generators shifts neither the training's random stream nor the steps'."""
        generators = ReaderGenerators(self._reader_seed())
        with generators:
            samples: Iterator[Any] = iter(stream_loader(self.source, self.epoch))
        if self.limit is not None:  # the first samples of the stream (sharded: of each rank's stream, its share)
            samples = itertools.islice(samples, self.limit if self.mode == "invariant" else -(-self.limit // self.world))
        while True:
            with generators:
                batch = list(itertools.islice(samples, self.batch_size))
            if not batch:
                return
            yield batch

    def weighted(self) -> Iterator[tuple[int, Any, bool]]:
        """``(weight, collated batch, real)`` for each of this rank's forwards, as the stream is read;
        a padding forward (lockstep only) has weight 0 and ``real`` False."""
        self.real, self.stream_first = 0, None
        first: Any = None
        batches = self._batches()
        started = time.monotonic()
        while True:
            mine, more = self._next_mine(batches)
            if self.notice_after_s is not None and time.monotonic() - started > self.notice_after_s:
                self._notice(time.monotonic() - started)
            if first is None:  # invariant: the stream's first sample; sharded: this rank's
                first = self.stream_first if self.stream_first is not None else (mine[0] if mine else None)
            if mine is None and not more:
                return
            if mine is None:  # another rank still has a batch: pad (lockstep)
                if first is None:  # nothing read on this rank: a sample to pad with, the same on every rank
                    first = first_sample(self.dataset, self.num_shards, self.seed, self.epoch)
                yield 0, pin_batch(self.collate_fn([first]), self.pin_memory), False
                continue
            self.real += 1
            # (ready batches: one per "sample", weighing its own samples, as Lightning's evaluation means)
            weight = batch_length(mine[0]) if self.collate_fn is first_of else len(mine)
            yield weight, pin_batch(self.collate_fn(mine), self.pin_memory), True

    def _notice(self, seconds: float) -> None:
        after, self.notice_after_s = self.notice_after_s, None  # once a pass
        log.warning("rank %d: this validation pass has read %s (a stream without __len__) for %.0f s, more than "
                    "trainer.collective_timeout_s=%g, and goes on: a stream is read to its end each pass; if it never "
                    "ends, set trainer.limit_val_batches to an integer (global validation batches)", self.rank,
                    type(self.dataset).__name__, seconds, after)

    def _next_mine(self, batches: Iterator[list[Any]]) -> tuple[list[Any] | None, bool]:
        """This rank's next batch (None: none left for it), and whether any rank still runs a forward."""
        if self.mode == "sharded":
            mine = next(batches, None)
            if not self.lockstep:
                return mine, mine is not None
            flag = torch.tensor([int(mine is not None)], device=self.strategy.device)
            return mine, bool(self.strategy.all_reduce_max(flag).item())
        # invariant: the next group of `world` batches, rank r's is the r-th; a group that exists
        # (a rank runs a forward) with none for this rank means padding under lockstep.
        group = list(itertools.islice(batches, self.world))
        if not group:
            return None, False
        if self.stream_first is None:
            self.stream_first = group[0][0]  # (pads like the others: the stream's first sample)
        mine = group[self.rank] if self.rank < len(group) else None
        if mine is None and not self.lockstep:
            return None, False  # the stream ended within this group: nothing more for this rank
        return mine, True


class ReaderGenerators:
    """The CPU generators of torch, ``random`` and NumPy as the stream's reader sees them: seeded once
    from ``seed``, swapped in around each read and out again after, so the reader draws the same
    numbers whether the pass reads the stream at once or batch by batch between the steps."""

    def __init__(self, seed: int):
        self.seed, self.state = seed, None
        self.saved: Any = None

    def __enter__(self) -> None:
        self.saved = _generator_states()
        if self.state is None:
            torch.default_generator.manual_seed(self.seed)
            random.seed(self.seed)
            if np is not None:
                np.random.seed(self.seed % (1 << 32))
        else:
            _set_generator_states(self.state)

    def __exit__(self, *exc: Any) -> None:
        self.state = _generator_states()
        _set_generator_states(self.saved)


def _generator_states() -> tuple[Any, Any, Any]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state() if np is not None else None


def _set_generator_states(states: tuple[Any, Any, Any]) -> None:
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    if np is not None:
        np.random.set_state(states[2])


def pin_batch(batch: Any, pin_memory: bool) -> Any:
    """``batch`` in page-locked memory with ``pin_memory`` on a CUDA machine (as a DataLoader pins it)."""
    if not (pin_memory and torch.cuda.is_available()):
        return batch
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin(batch)
