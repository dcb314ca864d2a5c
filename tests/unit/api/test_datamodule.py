"""DataModule: prepare_data / setup(stage) / data hooks through the Python API (its hooks win over
the module's, the same data on every rank, DDP 2 equal to one process) and through
``python train.py datamodule=digits``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import TensorDataset, random_split

from tests.support.helpers import REPO, Regressor, new_trainer, read_metrics, regression_data
from trainer import DataModule


class Regressions(DataModule):
    """Data drawn with the global generator and split by an unseeded random_split in setup: equal on
    every rank only because the trainer seeds setup alike on every rank. Records its calls."""

    def __init__(self):
        self.calls: list[str] = []

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")
        noise = torch.randn(250, 1)  # global generator
        data = regression_data(250)
        full = TensorDataset(data.tensors[0], data.tensors[1] + 0.1 * noise)
        self.train, self.val, self.test = random_split(full, [200, 27, 23])

    def train_dataset(self):
        return self.train

    def val_dataset(self):
        return self.val

    def test_dataset(self):
        return self.test

    def predict_dataset(self):
        return TensorDataset(torch.stack([self.test[i][0] for i in range(len(self.test))]))


class Steps(Regressor):
    """Steps only: the data come from the datamodule (train_dataset() here would be shadowed)."""

    test_step = Regressor.validation_step

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def trainer(tmp_path, name, **args):
    return new_trainer(tmp_path / name, **{"max_steps": 6, **args})


def test_datamodule_hooks_and_stages_in_one_process(tmp_path, caplog):
    datamodule, module = Regressions(), Steps()
    fitted = trainer(tmp_path, "one", batch_size=16)
    with caplog.at_level(logging.WARNING, logger="trainer.api.datamodule"):
        fitted.fit(module, datamodule=datamodule)
    # Regressor defines train_dataset(): the datamodule's wins, and the warning says so.
    assert "Steps.train_dataset(), Steps.val_dataset() not called: the datamodule Regressions gives that data" in caplog.text
    val_after_fit = fitted.logged_metrics["val/loss"]
    # module=None: the fitted module and its datamodule; setup draws the same split for every stage.
    assert fitted.validate()["val/loss"] == pytest.approx(val_after_fit, rel=1e-6)
    metrics = fitted.test()
    predictions = torch.cat(fitted.predict())
    assert datamodule.calls == ["prepare_data", "setup:fit", "prepare_data", "setup:validate",
                                "prepare_data", "setup:test", "prepare_data", "setup:predict"]
    assert predictions.shape == (23, 1)
    # The test metric is the mean over the datamodule's 23 test samples.
    x, y = (torch.stack(t) for t in zip(*[datamodule.test[i] for i in range(23)]))
    with torch.no_grad():
        assert metrics["test/loss"] == pytest.approx(float(torch.nn.functional.mse_loss(module(x), y)), rel=1e-5)


def test_datamodule_ddp_two_ranks_equals_one_process(tmp_path):
    one = trainer(tmp_path, "one", batch_size=16)
    one.fit(Steps(), datamodule=Regressions())
    ddp = trainer(tmp_path, "ddp", strategy="ddp", devices=2, batch_size=8)
    ddp.fit(Steps(), datamodule=Regressions())
    losses = [[r["train/loss"] for r in read_metrics(t.run_dir) if "train/loss" in r] for t in (one, ddp)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)  # the same data on every rank
    assert ddp.test()["test/loss"] == pytest.approx(one.test()["test/loss"], rel=1e-5)


def test_not_a_datamodule_is_an_error(tmp_path):
    with pytest.raises(TypeError, match=r"datamodule= expects a trainer.DataModule"):
        trainer(tmp_path, "x").fit(Steps(), datamodule=object())


def test_train_py_datamodule_group(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, os.path.join(REPO, "train.py"), "recipe=cnn", "datamodule=digits",
               "trainer.max_steps=4", "trainer.val_every_n_steps=null", "trainer.log_every_n_steps=2",
               "logger=[jsonl]", "checkpoint.save_last=false", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr  # Hydra's log handler writes to stdout
    # The datamodule's split (10% of the training images held out for test) gives 41 steps per epoch at
    # batch 32, the recipe's own split 45: the datamodule's data were trained on.
    assert "41 steps per epoch" in output, output[-3000:]
    assert "DigitsCNN.train_dataset(), DigitsCNN.val_dataset() not called" in output
    with open(run_dir / "metrics.jsonl") as f:
        assert [json.loads(line)["train/loss"] for line in f if "train/loss" in line]
