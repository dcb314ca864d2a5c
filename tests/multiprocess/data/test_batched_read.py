"""The batched read (one gather per tensor per micro-batch, for a ``TensorDataset`` with the default
collate) trains on exactly what per-sample reads train on, in every layout and after a resume.

Each run records, per step and rank, every micro-batch its ``training_step`` got (the samples' ids
and their tensors). The same run with a ``TensorDataset`` subclass (read per sample, as before the
gather) must record the same batches bitwise and train bitwise the same; the ranks' micro-batches of
a step, in the plan's order, are the one-process global batch; a run resumed from a mid-epoch
checkpoint records what the uninterrupted run recorded from there on.
"""

import os
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.helpers import read_metrics, run_trainer
from trainer import TrainModule
from trainer.data.batched_read import batch_reader

pytestmark = pytest.mark.timeout(300)
NUM_SAMPLES = 200  # 13 global batches of 16 per epoch, the last one short (8): its window covered too
STEPS = 15  # into the second epoch


class PerSample(TensorDataset):
    """The same tensors, read per sample and collated (a subclass may override ``__getitem__``)."""


def id_data(per_sample: bool) -> TensorDataset:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(NUM_SAMPLES, 6, generator=generator)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(NUM_SAMPLES, 1, generator=generator)
    return (PerSample if per_sample else TensorDataset)(torch.arange(NUM_SAMPLES), x, y)


class SeenBatches(TrainModule):
    """Regression that records every micro-batch it trains on in ``<run_dir>/batches_rank<r>.pt``."""

    def __init__(self, per_sample: bool):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.05, momentum=0.9))
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.per_sample, self.steps, self.current = per_sample, [], []

    def train_dataset(self):
        return id_data(self.per_sample)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        self.current.append((ids.clone(), x.clone(), y.clone()))
        return F.mse_loss(self(x), y)

    def on_train_step_end(self, step, metrics):
        self.steps.append(self.current)
        self.current = []

    def on_fit_end(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        torch.save(self.steps, os.path.join(self.trainer.run_dir, f"batches_rank{rank}.pt"))


LAYOUTS = {
    "one process": dict(batch_size=16),
    "ddp": dict(strategy="ddp", devices=2, batch_size=8),
    "ddp, accumulated": dict(strategy="ddp", devices=2, batch_size=4, accumulate_grad_batches=2),
    "fsdp": dict(strategy="fsdp", devices=2, batch_size=8),
}


def train(run_dir, per_sample: bool, layout: str, **args) -> dict:
    """``{rank: steps}`` and the logged losses of one run."""
    args = {**LAYOUTS[layout], "max_steps": STEPS, **args}
    run_trainer(run_dir, SeenBatches(per_sample), log_every_n_steps=1, **args)
    ranks = args.get("devices", 1)
    losses = {r["step"]: r["train/loss"] for r in read_metrics(str(run_dir)) if "train/loss" in r}
    return {"batches": {rank: torch.load(os.path.join(str(run_dir), f"batches_rank{rank}.pt")) for rank in range(ranks)},
            "losses": losses}


def assert_same_batches(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for rank in got:
        assert len(got[rank]) == len(expected[rank]), rank
        for step, (a, b) in enumerate(zip(got[rank], expected[rank])):
            assert len(a) == len(b), (rank, step)
            for micro, (fields_a, fields_b) in enumerate(zip(a, b)):
                for field, (u, v) in enumerate(zip(fields_a, fields_b)):
                    where = (rank, step, micro, field)
                    assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v), where


def global_batches(batches: dict) -> list[list[int]]:
    """Each step's ids over the ranks in the plan's order (micro-step by micro-step, rank by rank)."""
    ranks = sorted(batches)
    return [[i for micro in range(len(batches[0][step])) for rank in ranks for i in batches[rank][step][micro][0].tolist()]
            for step in range(len(batches[0]))]


def test_the_runs_gather_their_batches():
    assert batch_reader(id_data(False), SeenBatches(False).collate_fn) is not None
    assert batch_reader(id_data(True), SeenBatches(True).collate_fn) is None


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return train(tmp_path_factory.mktemp("one") / "run", False, "one process")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batched_reads_train_on_what_per_sample_reads_train_on(layout, one_process, tmp_path):
    batched = one_process if layout == "one process" else train(tmp_path / "batched", False, layout)
    per_sample = train(tmp_path / "per_sample", True, layout)
    assert_same_batches(batched["batches"], per_sample["batches"])
    assert batched["losses"] == per_sample["losses"] and len(batched["losses"]) == STEPS  # bitwise
    full = [step for step in global_batches(one_process["batches"]) if len(step) == 16]
    assert len(full) == STEPS - 1  # all but the epoch's short last batch
    mine = global_batches(batched["batches"])
    assert [step for step in mine if len(step) == 16] == full  # the one-process global batches
    assert sorted(i for step in mine[:13] for i in step) == list(range(NUM_SAMPLES))  # the epoch, each sample once


@pytest.mark.parametrize("layout", ["one process", "ddp, accumulated"])
def test_a_resumed_run_reads_what_the_uninterrupted_one_read(layout, one_process, tmp_path):
    whole = one_process if layout == "one process" else train(tmp_path / "whole", True, layout)  # per sample
    first = train(tmp_path / "first", False, layout, max_steps=5, checkpoint=dict(every_n_steps=5, format="full"))
    resumed = train(tmp_path / "resumed", False, layout, resume=str(tmp_path / "first" / "checkpoints"))
    assert sorted(resumed["losses"]) == list(range(6, STEPS + 1))  # resumed mid-epoch, at step 5 of 13
    joined = {rank: first["batches"][rank] + resumed["batches"][rank] for rank in first["batches"]}
    assert_same_batches(joined, whole["batches"])
    assert {**first["losses"], **resumed["losses"]} == whole["losses"]
