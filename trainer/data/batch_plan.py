"""Which samples each rank loads: the global-batch-invariant plan (seeding: ``seeding.py``; loaders: ``loaders.py``).

The invariant: the samples of global step k depend only on the seed, the epoch and k.
The epoch's order is one permutation keyed by ``(seed, epoch)`` (``trainer.data.permutation``: computed per
position, never built whole, so a step costs O(global batch) and a rank's memory does not grow with
the dataset); global step k takes the next ``global_batch_size`` positions of it, and only then are
they dealt out to micro-steps and ranks.
So one process with batch 32, two ranks with batch 16, or two ranks with 4 x 4 accumulation
all see the same 32 samples at step k, and the trainer weights every micro-batch by its share
of the global batch so the gradient is that of the global batch's mean loss. A user's sampler (``DataLoader(sampler=...)``)
replaces the permutation as the source of the epoch's order (``SamplerStream``); the dealing is the same.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from trainer.data.permutation import IndexPermutation
from trainer.runtime.seeding import derive_seed, seeded
from trainer.data.validation_shard import ValidationShard


class SamplerStream:
    """An epoch's sample order drawn from a user's sampler (``DataLoader(sampler=...)``), the same on
    every rank and for every world size: epoch e calls ``sampler.set_epoch(e)`` if it has one, then
    draws the whole index stream with the global generators seeded from ``(seed, purpose, e)``
    (so a resumed run draws it again). O(stream) per rank; the trainer's own order (``shuffle``)
    does not go through here."""

    def __init__(self, sampler: Any, dataset_size: int, seed: int, purpose: str, where: str):
        try:
            self.length = len(sampler)
        except TypeError:
            raise TypeError(f"{where}: the sampler {type(sampler).__name__} has no len(); the trainer needs the "
                            "number of samples per epoch to plan the steps: give it __len__") from None
        if self.length < 1:
            raise ValueError(f"{where}: the sampler {type(sampler).__name__} yields no samples (len 0)")
        self.sampler, self.dataset_size, self.seed, self.purpose, self.where = sampler, dataset_size, seed, purpose, where
        self._cached: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        return self.length

    def epoch_order(self, epoch: int) -> list[int]:
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        name = type(self.sampler).__name__
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)
        with seeded(derive_seed(self.seed, self.purpose, "sampler", epoch)):
            try:
                order = [operator.index(i) for i in self.sampler]
            except TypeError:
                raise TypeError(f"{self.where}: the sampler {name} must yield integer indices of the dataset") from None
        if len(order) != self.length:
            raise ValueError(f"{self.where}: the sampler {name} yielded {len(order)} indices in epoch {epoch}, "
                             f"but its len() is {self.length}")
        if order and (min(order) < 0 or max(order) >= self.dataset_size):
            raise ValueError(f"{self.where}: the sampler {name} yielded an index outside the dataset's "
                             f"0..{self.dataset_size - 1}")
        self._cached = (epoch, order)
        return order


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs ~1 us, and one is built per step)
class MicroBatch:
    """One forward/backward on one rank: the sample indices to load and how many of them count.

    ``num_real`` is 0 for a padding micro-batch (a rank with nothing left in a short last window
    still runs a step so that every rank makes the same collectives; its loss weight is 0)."""

    indices: tuple[int, ...]
    num_real: int


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs ~1 us, and one is built per step)
class StepPlan:
    """The micro-batches of one optimizer step on one rank, and the global batch's sample count."""

    micro_batches: tuple[MicroBatch, ...]
    global_count: int


_RECENT_STEPS = 64  # step plans kept: how far a loader's prefetching may run ahead of the step loop
# Positions of the epoch's order permuted in one vectorised pass and kept (whole global batches, at
# least one): the pass costs about the same for 64 positions as for 4096, so the steps share it.
_CHUNK_POSITIONS = 4096


class GlobalBatchPlan:
    """Deals an epoch's samples into global batches, micro-steps and ranks.

    Args:
        num_samples: length of the dataset.
        micro_batch_size: samples per rank per forward (``data.batch_size``).
        accumulate: micro-steps per optimizer step (``trainer.accumulate_grad_batches``).
        world_size: data-parallel ranks.
        seed: base seed; epoch e is shuffled with ``derive_seed(seed, "epoch", e)``.
        shuffle: a new permutation each epoch (False: dataset order).
        drop_last: drop a short last global batch instead of training on it.
        order: where the epoch's order comes from instead (a user's sampler, ``SamplerStream``);
            ``num_samples`` is then its length per epoch.
    """

    def __init__(
        self,
        num_samples: int,
        micro_batch_size: int,
        accumulate: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        order: SamplerStream | None = None,
    ):
        for name, value in (("micro_batch_size", micro_batch_size), ("accumulate", accumulate), ("world_size", world_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_samples = num_samples
        self.micro_batch_size = micro_batch_size
        self.accumulate = accumulate
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.order = order
        self.global_batch_size = micro_batch_size * accumulate * world_size
        self._epoch_permutation: tuple[int, IndexPermutation] | None = None
        self._chunk: tuple[int, int, list[int]] | None = None  # (epoch, first position, the samples there)
        self._chunk_steps = max(1, _CHUNK_POSITIONS // self.global_batch_size)
        self._recent: dict[tuple[int, int, int], StepPlan] = {}
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the dataset has {num_samples} samples, fewer than one global batch of {self.global_batch_size} "
                f"(batch_size {micro_batch_size} x accumulate {accumulate} x world size {world_size}) with drop_last"
            )

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def describe_global_batch(self) -> str:
        """The global batch a step trains on, for the start-up log line."""
        factors = f"batch {self.micro_batch_size} x accumulate {self.accumulate} x {self.world_size} ranks"
        if self.num_samples >= self.global_batch_size:
            return f"{self.global_batch_size} ({factors})"
        return f"{self.num_samples} (all samples of the epoch; {factors} would be {self.global_batch_size})"

    def short_of_one_batch(self) -> str | None:
        """What really happens when an epoch holds fewer samples than one global batch (None if not)."""
        if self.num_samples >= self.global_batch_size:
            return None
        grid = self.layout(list(range(self.num_samples)))
        sizes = sorted({len(cell) for row in grid for cell in row})
        return (
            f"the dataset has {self.num_samples} samples per epoch, fewer than one global batch of {self.global_batch_size} "
            f"(batch_size {self.micro_batch_size} x accumulate {self.accumulate} x world size {self.world_size}): every "
            f"step trains on all {self.num_samples} samples (one step per epoch), as {len(grid)} micro-batch(es) of "
            f"{' or '.join(map(str, sizes))} samples per rank; lower data.batch_size or trainer.accumulate_grad_batches "
            "for a global batch that fits"
        )

    def _permutation(self, epoch: int) -> IndexPermutation:
        if self._epoch_permutation is None or self._epoch_permutation[0] != epoch:
            self._epoch_permutation = (epoch, IndexPermutation(self.num_samples, derive_seed(self.seed, "epoch", epoch)))
        return self._epoch_permutation[1]

    def positions(self, epoch: int, start: int, stop: int) -> list[int]:
        """The samples at positions ``start .. stop-1`` of the epoch's order (the same on every rank
        and for every world size), computed for those positions only: O(stop - start).

        A global batch's positions come from a chunk of the next few global batches' positions,
        permuted in one pass and kept (at most ``max(4096, global batch)`` samples): steps read
        their slice of it, a request outside it (a new epoch, a resume, going back) starts a new one."""
        stop = min(stop, self.num_samples)
        if self.order is not None:
            return list(self.order.epoch_order(epoch)[start:stop])
        if not self.shuffle:
            return list(range(start, stop))
        chunk = self._chunk
        if chunk is None or chunk[0] != epoch or start < chunk[1] or stop > chunk[1] + len(chunk[2]):
            if stop - start > self._chunk_steps * self.global_batch_size:  # the whole epoch (tests, tools): not kept
                return self._permutation(epoch).range(start, stop).tolist()
            end = start + self._chunk_steps * self.global_batch_size
            # (CPU tensors: data loading, no device sync)
            chunk = self._chunk = (epoch, start, self._permutation(epoch).range(start, end).tolist())
        return chunk[2][start - chunk[1] : stop - chunk[1]]

    def epoch_order(self, epoch: int) -> list[int]:
        """The whole epoch's order, O(dataset): for tests and tools; training reads it step by step."""
        return self.positions(epoch, 0, self.num_samples)

    def global_batch(self, epoch: int, step: int) -> list[int]:
        """The sample indices of global step ``step`` (0-based within the epoch): O(global batch)."""
        start = step * self.global_batch_size
        return self.positions(epoch, start, start + self.global_batch_size)

    def layout(self, samples: Sequence[int]) -> list[list[list[int]]]:
        """Deal one global batch into ``[micro_step][rank] -> indices``.

        A full batch gives every cell ``micro_batch_size`` samples. A short one uses only the
        micro-steps it needs and spreads its samples evenly over those cells, so no cell is
        empty unless there are fewer samples than ranks."""
        per_micro_step = self.micro_batch_size * self.world_size
        micro_steps = -(-len(samples) // per_micro_step)
        cells = micro_steps * self.world_size
        base, extra = divmod(len(samples), cells)
        grid: list[list[list[int]]] = []
        position = 0
        for m in range(micro_steps):
            row = []
            for r in range(self.world_size):
                size = base + (1 if m * self.world_size + r < extra else 0)
                row.append(list(samples[position : position + size]))
                position += size
            grid.append(row)
        return grid

    def step_plan(self, epoch: int, step: int, rank: int) -> StepPlan:
        """What rank ``rank`` loads at global step ``step`` of ``epoch``: O(global batch)."""
        key = (epoch, step, rank)
        plan = self._recent.get(key)
        if plan is not None:  # the step loop and its loader (running ahead) ask for the same steps
            return plan
        samples = self.global_batch(epoch, step)
        size = self.micro_batch_size
        if len(samples) == self.global_batch_size:  # a full global batch: every cell full, as layout() deals it
            cells = range(rank, self.accumulate * self.world_size, self.world_size)
            micro_batches = tuple(MicroBatch(tuple(samples[cell * size:(cell + 1) * size]), size) for cell in cells)
        else:
            # A padding micro-batch loads one real sample so the model runs, with weight 0.
            micro_batches = tuple(MicroBatch(tuple(row[rank]) if row[rank] else (samples[0],), len(row[rank]))
                                  for row in self.layout(samples))
        plan = self._recent[key] = StepPlan(micro_batches, len(samples))
        if len(self._recent) > _RECENT_STEPS:
            del self._recent[next(iter(self._recent))]  # the oldest
        return plan

    def rank_steps(self, epoch: int, rank: int, start_step: int = 0) -> Iterator[StepPlan]:
        """Rank ``rank``'s steps of ``epoch`` from ``start_step`` on (a resumed run's position),
        computed lazily one step at a time."""
        for step in range(start_step, self.steps_per_epoch):
            yield self.step_plan(epoch, step, rank)

    def rank_batches(self, epoch: int, rank: int, start_step: int = 0) -> RankBatches:
        """The indices of rank ``rank``'s micro-batches from ``start_step`` on, lazily (for its loader)."""
        return RankBatches(self, epoch, rank, start_step)

    def micro_steps(self, step: int) -> int:
        """How many micro-batches each rank runs at global step ``step``."""
        size = min(self.global_batch_size, self.num_samples - step * self.global_batch_size)
        return -(-size // (self.micro_batch_size * self.world_size))


class RankBatches:
    """One rank's micro-batch indices of an epoch from a start step, computed step by step as a
    loader asks for them (iterable again for each pass; ``len`` without computing them)."""

    def __init__(self, plan: GlobalBatchPlan, epoch: int, rank: int, start_step: int):
        self.plan, self.epoch, self.rank, self.start_step = plan, epoch, rank, start_step

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        for step_plan in self.plan.rank_steps(self.epoch, self.rank, self.start_step):
            for micro_batch in step_plan.micro_batches:
                yield micro_batch.indices

    def __len__(self) -> int:
        last = self.plan.steps_per_epoch - 1  # every step before the last one is a full global batch
        if self.start_step > last:
            return 0
        return (last - self.start_step) * self.plan.accumulate + self.plan.micro_steps(last)


def validation_shard(num_samples: int, batch_size: int, rank: int, world_size: int) -> ValidationShard:
    """Rank ``rank``'s validation batches: every sample exactly once over all ranks, no padding
    (padding with duplicates, as DistributedSampler does, would skew the metrics); built lazily."""
    return ValidationShard(num_samples, batch_size, rank, world_size)
