"""A training DataLoader's own batch_sampler: its batches are the global batches, on any world size,
each rank taking the same contiguous part of every batch (trainer/data/batch_sampler.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from trainer import Trainer, TrainModule
from trainer.data.user_loader import RunData


class Streams(Sampler):
    """Lightning's LSTM-demo pattern: row j of every batch continues row j of the batch before."""

    def __init__(self, size: int, rows: int, last: int | None = None):
        self.size, self.rows, self.last = size, rows, last

    def __iter__(self):
        chunks = self.size // self.rows
        batches = [list(range(i, chunks * self.rows, chunks)) for i in range(chunks)]
        if self.last is not None:  # a differently sized batch at the end
            batches.append(list(range(self.last)))
        return iter(batches)

    def __len__(self):
        return self.size // self.rows + (self.last is not None)


class WithBatchSampler(TrainModule):
    def __init__(self, batch_sampler):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
        self.batch_sampler = batch_sampler

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(24.0)), batch_sampler=self.batch_sampler)


def _steps(world_size: int, batch_sampler) -> tuple[int, list[list[list[int]]]]:
    """The trainer's per-rank micro-batch and, per step, each rank's samples."""
    trainer = Trainer(strategy="ddp" if world_size > 1 else "single", devices=world_size)
    data = RunData(WithBatchSampler(batch_sampler), trainer)
    plan = data.plan(world_size)
    steps = [[[i for micro in plan.step_plan(0, k, r).micro_batches for i in micro.indices]
              for r in range(world_size)] for k in range(plan.steps_per_epoch)]
    return data.batch.batch_size, steps


@pytest.mark.parametrize("world_size", [1, 2, 3, 6])
def test_each_batch_is_one_global_batch_split_in_contiguous_parts(world_size):
    batches = list(Streams(24, 6))
    batch_size, steps = _steps(world_size, Streams(24, 6))
    assert batch_size == 6 // world_size
    assert len(steps) == len(batches) == 4
    for step, batch in zip(steps, batches):
        assert step == [batch[r * batch_size:(r + 1) * batch_size] for r in range(world_size)]


def test_a_short_last_batch_is_a_short_last_global_batch():
    _, steps = _steps(2, Streams(24, 8, last=4))
    assert [sum(map(len, step)) for step in steps] == [8, 8, 8, 4]


def test_what_cannot_be_split_or_planned_is_refused():
    with pytest.raises(ValueError, match=r"4 data-parallel rank\(s\) x accumulate_grad_batches 1 = 4 does not divide 6"):
        _steps(4, Streams(24, 6))

    class Uneven(Streams):
        def __iter__(self):
            return iter([[0, 1, 2], [3, 4], [5, 6, 7]])

    with pytest.raises(ValueError, match=r"gave batch 1 of 2 samples after batches of 3"):
        _steps(1, Uneven(24, 6))
