"""The training steps of a streaming (iterable) dataset: ``StreamPlan`` stands in for
trainer/data/batch_plan.py's ``GlobalBatchPlan`` in the loop (``rank_steps`` / ``rank_batches``).

- ``invariant``: every rank reads the whole stream (torchdata's ``StatefulDataLoader`` over the
  trainer's ``ShardReader``; with W workers their samples interleave one by one in worker order).
  The stream is cut into global batches of ``micro x accumulate x data-parallel size`` samples and
  each is dealt by ``GlobalBatchPlan.layout``, so training equals one process on any world size
  for the same ``num_workers`` (another worker count reads the shards in another order). No
  collective, no host sync.
- ``sharded``: each rank reads its own shards and fills ``accumulate`` micro-batches from its
  stream; one small all-reduce per step sums the real samples (the exact mean-loss weights) and ends
  the epoch when every rank is exhausted; a rank with nothing left runs padding micro-batches
  (weight 0). NOT equal to one process: the samples of a step depend on the world size.

Micro-batches are collated in the main process (workers load samples); a step's samples are read
when the loop asks for the step, and the loader's position is kept per step boundary, so a
checkpoint records the position of the last step trained (not what was prefetched since).
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
from collections import deque
from typing import Any, Iterator

import torch

from trainer.data.batch_plan import GlobalBatchPlan, MicroBatch, StepPlan
from trainer.data.loaders import _loading_generators
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.seeding import derive_seed
from trainer.data.streaming.loader import stream_loader
from trainer.data.streaming.protocol import MODES, check_enough_shards, first_sample, shard_count

log = logging.getLogger(__name__)
EXHAUSTED = {"exhausted": True}  # the position of a rank's stream that has ended in this epoch



def is_stream(plan: Any) -> bool:
    """Whether ``plan`` is a stream's plan (a `StreamPlan`), not a map-style dataset's."""
    return getattr(plan, "is_stream", False)


class StreamBatches:
    """The collated micro-batches of the step the plan handed out last (the loop's batch iterator)."""

    is_stream = True

    def __init__(self, queue: deque):
        self.queue = queue

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self.queue:
            raise RuntimeError("the streaming plan has no micro-batch left for this step (read beyond the step's plan)")
        return self.queue.popleft()


class StreamPlan:
    """The steps of one rank over a streaming training dataset (see the module docstring)."""

    is_stream = True

    def __init__(self, dataset: Any, trainer: Any, batch: Any, world: int, rank: int, collate_fn: Any, options: Any):
        mode = trainer.stream_mode
        if mode not in MODES:
            raise ValueError(f"data.stream_mode={mode!r}: give one of {', '.join(MODES)}")
        if trainer.strategy.owns_step:
            raise ValueError(f"a streaming (iterable) training dataset is not supported under strategy="
                             f"{trainer.strategy.name}; use a map-style dataset (__getitem__ + __len__)")
        self.dataset, self.mode, self.world, self.rank = dataset, mode, world, rank
        self.strategy, self.collate_fn, self.options = trainer.strategy, collate_fn, options
        self.seed, self.drop_last = trainer.seed, batch.drop_last  # batch: the run's resolved BatchSettings
        self.micro_batch_size, self.accumulate = batch.batch_size, batch.accumulate_grad_batches
        self.global_batch_size = self.micro_batch_size * self.accumulate * world
        self.num_shards = shard_count(dataset)
        self.num_workers = options.num_workers
        if options.persistent_workers:
            raise ValueError("persistent_workers=True cannot be honoured with a streaming dataset: its loader is built "
                             "again each epoch (the epoch's shard order goes to the workers); remove persistent_workers")
        self.pin_memory = options.pin_memory and torch.cuda.is_available()
        name = type(dataset).__name__
        if self.num_workers > 0 and not callable(getattr(dataset, "shard_samples", None)):
            # One shard is read by one worker: the others get nothing, and a dataset that splits itself by
            # get_worker_info() (torch's pattern; a raw Hugging Face IterableDataset) would lose their share.
            raise ValueError(f"{name} is an IterableDataset without the shard protocol (n_shards + shard_samples), "
                             f"so it is one shard read by one reader; with data.num_workers={self.num_workers} the "
                             "other workers would read nothing (or, if it splits itself by get_worker_info(), their "
                             "samples would be lost): give it the protocol (trainer.ShardedIterable) or num_workers=0")
        if mode == "sharded":
            check_enough_shards(self.num_shards, world, self.num_workers, name)
            if self.drop_last:
                # The first step short on ANY rank would end the epoch and drop the other ranks' remaining shards.
                raise ValueError("data.drop_last=true with data.stream_mode=sharded cannot be honoured as a last short "
                                 "batch: the ranks run short at different steps, so whole shards would be dropped; "
                                 "remove drop_last (the short steps are weighted exactly) or use stream_mode=invariant")
        self.layouts = GlobalBatchPlan(self.global_batch_size, self.micro_batch_size, self.accumulate, world, self.seed)
        self.steps_per_epoch = math.inf  # the epoch ends where the stream does
        self.estimated_steps = self._estimate()
        self.ended: set[int] = set()  # epochs whose stream ended
        self.resume: tuple[int, int, Any] | None = None  # (epoch, epoch_step, loader state) of a checkpoint
        self._states: dict[tuple[int, int], Any] = {}  # (epoch, steps done) -> loader state after them
        self._queue: deque = deque()
        self._pad: Any = None  # a sample for padding micro-batches (sharded)

    def _estimate(self) -> int | None:
        if self.mode == "sharded":  # uneven shards: the busiest rank decides the epoch's steps, unknown up front
            return None
        try:
            length = len(self.dataset)
        except TypeError:
            return None
        full, rest = divmod(length, self.global_batch_size)
        return max(1, full + (1 if rest and not self.drop_last else 0))

    # ----- what the loop logs ------------------------------------------------------------------------------
    def describe_global_batch(self) -> str:
        factors = f"batch {self.micro_batch_size} x accumulate {self.accumulate} x {self.world} ranks"
        if self.mode == "invariant":
            return (f"{self.global_batch_size} ({factors}; streaming, data.stream_mode=invariant: every rank reads the "
                    f"whole stream, equal to one process with the same num_workers)")
        return (f"{self.global_batch_size} at most ({factors}; streaming, data.stream_mode=sharded: each rank reads its "
                f"own shards, {self.num_shards} shards; NOT equal to one process, resumable on {self.world} ranks only)")

    def short_of_one_batch(self) -> None:
        return None

    # ----- steps -------------------------------------------------------------------------------------------
    def rank_steps(self, epoch: int, rank: int, start_step: int = 0) -> Iterator[StepPlan]:
        """The steps of ``epoch`` from ``start_step`` on (a resumed run: from the checkpoint's position)."""
        state = None
        if start_step > 0:
            if self.resume is None or self.resume[:2] != (epoch, start_step):
                raise ValueError(f"no stream position for epoch {epoch}, step {start_step} in the checkpoint: a "
                                 "streaming dataset resumes only from a checkpoint that recorded its position")
            state = self.resume[2]
        self.resume = None
        self.ended.discard(epoch)
        self._states = {(epoch, start_step): state}
        loader = stream_loader(self, epoch)
        if state is not None and state != EXHAUSTED:
            loader.load_state_dict(state)
        return self._steps(loader, epoch, rank, start_step, exhausted=state == EXHAUSTED)

    def rank_batches(self, epoch: int, rank: int, start_step: int = 0) -> StreamBatches:
        return StreamBatches(self._queue)

    def _steps(self, loader: Any, epoch: int, rank: int, step: int, exhausted: bool) -> Iterator[StepPlan]:
        samples_of = iter(()) if exhausted else iter(loader)
        take = self.global_batch_size if self.mode == "invariant" else self.micro_batch_size * self.accumulate
        reader_rank = self.rank if self.mode == "sharded" else 0  # invariant: every rank reads the same stream
        while True:
            if self.num_workers:
                samples = list(itertools.islice(samples_of, take))
            else:  # read in this process: a reader's draws from the global generators must not shift training's
                with _loading_generators(derive_seed(self.seed, "stream-read", epoch, step, reader_rank)):
                    samples = list(itertools.islice(samples_of, take))
            # A loader that ran out is not resumed from its state (a finished StatefulDataLoader would
            # start the epoch again): its position is "exhausted".
            exhausted = exhausted or len(samples) < take
            plan = self._invariant_step(samples, (epoch, step)) if self.mode == "invariant" else \
                self._sharded_step(samples, epoch, step)
            if plan is None:
                self.ended.add(epoch)
                if step == 0:  # as Lightning: the epoch ends without a step (its hooks still run), not an error
                    rank_zero_warn(log, "the streaming dataset %s gave no full global batch in epoch %d (global batch "
                                   "%d, drop_last=%s): the epoch ends without a training step", type(self.dataset).__name__,
                                   epoch, self.global_batch_size, self.drop_last)
                return
            step += 1
            self._states[(epoch, step)] = EXHAUSTED if exhausted else copy.deepcopy(loader.state_dict())
            self._states.pop((epoch, step - 3), None)  # the loop may ask for the position one step back
            yield plan

    def _collate(self, samples: list, key: tuple) -> None:
        # Under generators seeded by the micro-batch's position (as the map-style loaders do): a collate
        # that draws random numbers neither shifts the training's own stream (dropout) nor differs on resume.
        with _loading_generators(derive_seed(self.seed, "stream-collate", *key)):
            batch = self.collate_fn(samples)
        if self.pin_memory:  # data.pin_memory: the copy to the GPU is non-blocking (trainer/loop/train_step.py)
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch)
        self._queue.append(batch)

    def _invariant_step(self, samples: list, where: tuple[int, int]) -> StepPlan | None:
        if not samples or (len(samples) < self.global_batch_size and self.drop_last):
            return None
        self._queue.clear()
        micro_batches = []
        for m, row in enumerate(self.layouts.layout(range(len(samples)))):
            mine = row[self.rank]
            micro_batches.append(MicroBatch(tuple(mine) if mine else (0,), len(mine)))
            # padding: one real sample, weight 0; keyed by the cell's first stream position (not the rank)
            self._collate([samples[i] for i in (mine or [0])], (*where, m, mine[0] if mine else -1))
        return StepPlan(tuple(micro_batches), len(samples))

    def _sharded_step(self, samples: list, epoch: int, step: int) -> StepPlan | None:
        # The one agreement per step ("stream exhausted"): the step's real samples over ranks.
        count = torch.tensor([len(samples)], dtype=torch.int64, device=self.strategy.device)
        total = int(self.strategy.all_reduce_sum(count).item())
        if total == 0 or (total < self.global_batch_size and self.drop_last):
            return None
        if samples:
            self._pad = samples[0]
        elif self._pad is None:  # nothing read on this rank yet: the first sample of the epoch's first shard
            self._pad = first_sample(self.dataset, self.num_shards, self.seed, epoch)
        self._queue.clear()
        micro_batches = []
        size = self.micro_batch_size
        for m in range(self.accumulate):
            mine = samples[m * size:(m + 1) * size]
            micro_batches.append(MicroBatch(tuple(range(m * size, m * size + len(mine))) or (0,), len(mine)))
            self._collate(mine or [self._pad], (epoch, step, self.rank, m))
        return StepPlan(tuple(micro_batches), total)

    # ----- checkpoints -------------------------------------------------------------------------------------
    def checkpoint_state(self, epoch: int, epoch_step: int) -> dict[str, Any]:
        """This rank's stream position after ``epoch_step`` steps of ``epoch`` (saved with a checkpoint)."""
        if epoch_step == 0:
            loader = None  # a fresh epoch
        elif (epoch, epoch_step) in self._states:
            loader = self._states[(epoch, epoch_step)]
        else:
            raise RuntimeError(f"the stream position after step {epoch_step} of epoch {epoch} is no longer known")
        return {"mode": self.mode, "world": self.world, "num_workers": self.num_workers, "epoch": epoch,
                "epoch_step": epoch_step, "loader": loader}

    def loader_seed(self, epoch: int) -> int:
        """The loader's seed (workers' seeds follow from it): the same on every rank in invariant mode."""
        return derive_seed(self.seed, "stream", epoch, self.rank if self.mode == "sharded" else 0)
