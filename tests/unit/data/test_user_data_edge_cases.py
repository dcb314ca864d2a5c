"""The module's own data at the edges: an IterableDataset and a global batch
larger than the dataset get a clear message; the loader's batch size with ``data.global_batch_size``;
the loader's batch size reaches a strategy before it wraps. Modules from test_user_data.py.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from tests.support.helpers import run_trainer, train_losses
from tests.multiprocess.data.test_user_data import TOL, LoaderModule, labelled_data, seen
from trainer import Trainer

pytestmark = pytest.mark.timeout(240)


# ----- item 15: an IterableDataset (a stream: trainer/data/streaming/, tests/multiprocess/data/test_streaming.py) -----------------------
class Stream(IterableDataset):
    def __iter__(self):
        return iter(labelled_data())


class StreamingModule(LoaderModule):
    def __init__(self, where):
        super().__init__(batch_size=4)
        self.where = where

    def train_dataloader(self):
        return DataLoader(Stream(), batch_size=4) if self.where == "train_dataloader" else None

    def train_dataset(self):
        return Stream() if self.where == "train_dataset" else labelled_data()

    def val_dataset(self):
        return Stream() if self.where == "val_dataset" else None

    def test_dataset(self):
        return Stream()

    def test_step(self, batch, batch_idx):
        return self.training_step(batch, batch_idx)


@pytest.mark.parametrize("where", ["train_dataset", "train_dataloader", "val_dataset"])
def test_an_iterable_dataset_is_read_as_a_stream(tmp_path, where):
    trainer = Trainer(max_steps=2, loggers=["jsonl"], progress_bar=False, run_dir=str(tmp_path), val_every_n_steps=2)
    trainer.fit(StreamingModule(where))
    assert trainer.global_step == 2
    # testing reads a stream too: every batch of it once (the test loss is the mean over them)
    module = StreamingModule(where)
    results = trainer.test(module)
    assert set(results) == {"test/loss"} and results["test/loss"] >= 0


# ----- item 16: a global batch larger than the dataset ----------------------------------------------------------
def test_a_global_batch_larger_than_the_dataset_is_reported_truly(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, LoaderModule(batch_size=32), accumulate_grad_batches=4, max_steps=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the dataset has 120 samples per epoch, fewer than one global batch of 128 (batch_size 32 x accumulate 4 "
               "x world size 1): every step trains on all 120 samples (one step per epoch), as 4 micro-batch(es) of 30 "
               "samples per rank" in w for w in warnings), warnings
    start = next(r.getMessage() for r in caplog.records if "steps per epoch" in r.getMessage())
    assert "global batch 120 (all samples of the epoch; batch 32 x accumulate 4 x 1 ranks would be 128)" in start
    assert [len(step) for step in seen(tmp_path)["steps"]] == [120, 120]


def test_global_batch_size_with_the_loader_batch_size():
    from trainer.data.user_loader import RunData

    # data.batch_size unset: data.global_batch_size is checked against the loader's batch size.
    trainer = Trainer(global_batch_size=48)
    batch = RunData(LoaderModule(batch_size=16), trainer).batch  # the run's settings; the Trainer keeps its own
    assert (batch.batch_size, batch.accumulate_grad_batches, batch.global_batch_size) == (16, 3, 48)
    with pytest.raises(ValueError, match="global_batch_size=40 is not a multiple of data.batch_size 16"):
        RunData(LoaderModule(batch_size=16), Trainer(global_batch_size=40))


class PipelinedLoaderModule(LoaderModule):
    """LoaderModule as two pipeline layers (the pipeline reads the batch size when it wraps)."""

    def __init__(self, **loader):
        super().__init__(**loader)
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 1))

    def pipeline_layers(self):
        return list(self.net)

    def pipeline_input(self, batch):
        return batch[0]

    def pipeline_loss(self, output, batch):
        return F.mse_loss(output, batch[1])


def test_the_loader_batch_size_reaches_the_strategy_before_it_wraps(tmp_path):
    from trainer.strategies.pipeline import PipelineStrategy

    run_trainer(tmp_path / "single", PipelinedLoaderModule(batch_size=16), max_steps=3)
    run_trainer(tmp_path / "pp", PipelinedLoaderModule(batch_size=16), strategy=PipelineStrategy(microbatches=4),
                devices=2, max_steps=3)
    torch.testing.assert_close(torch.tensor(train_losses(str(tmp_path / "pp"))),
                               torch.tensor(train_losses(str(tmp_path / "single"))), **TOL)
    assert [len(step) for step in seen(tmp_path / "single")["steps"]] == [16, 16, 16]
    assert seen(tmp_path / "pp")["batch_size"] == 16
