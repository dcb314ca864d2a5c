"""``Trainer.validate`` / ``test`` / ``predict`` with a DataModule never read the training data, on
one process and on 2 ranks (as Lightning): the DataModule below builds its training set only in
``setup("fit")``, so calling ``train_dataloader()`` in any other stage fails. The results on 2 ranks
equal one process's (the same samples, exact means)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L

pytestmark = pytest.mark.timeout(600)


class FitOnlyTrainSteps:
    """(A DataModule's hooks, for Lightning's class and ours.) Training data exists only after ``setup("fit")``; evaluation data after any setup."""

    def setup(self, stage):
        if stage == "fit":
            self.train_set = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
        generator = torch.Generator().manual_seed(1)
        self.eval_set = TensorDataset(torch.randn(12, 3, generator=generator), torch.randn(12, 1, generator=generator))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=4)  # AttributeError unless set up for fit

    def val_dataloader(self):
        return DataLoader(self.eval_set, batch_size=2)

    test_dataloader = predict_dataloader = val_dataloader


class RegressionSteps:
    """(A LightningModule's hooks, for Lightning's class and ours.)"""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def training_step(self, batch, batch_idx):
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class FitOnlyTrainData(FitOnlyTrainSteps, L.LightningDataModule):
    pass


class Regression(RegressionSteps, L.LightningModule):
    pass


def _trainer(tmp_path, devices):
    flags = dict(strategy="ddp", devices=2, accelerator="cpu") if devices == 2 else {}
    return L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), **flags)


def test_evaluation_calls_never_read_the_training_data(tmp_path):
    results = {}
    for devices in (1, 2):
        trainer = _trainer(tmp_path / str(devices), devices)
        results[devices] = (trainer.validate(Regression(), datamodule=FitOnlyTrainData()),
                            trainer.test(Regression(), datamodule=FitOnlyTrainData()),
                            trainer.predict(Regression(), datamodule=FitOnlyTrainData()))
    (val1, test1, pred1), (val2, test2, pred2) = results[1], results[2]
    assert val1[0]["val_loss"] == pytest.approx(val2[0]["val_loss"], rel=1e-6)
    assert test1[0]["test_loss"] == pytest.approx(test2[0]["test_loss"], rel=1e-6)
    assert val1[0]["val_loss"] == pytest.approx(test1[0]["test_loss"], rel=1e-6)  # the same set
    torch.testing.assert_close(torch.cat(pred2), torch.cat(pred1))
    assert len(pred1) == 6


def test_lightning_itself_reads_no_training_data_in_evaluation(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    module = type("PlRegression", (RegressionSteps, pl.LightningModule), {})
    datamodule = type("PlData", (FitOnlyTrainSteps, pl.LightningDataModule), {})
    expected = trainer.validate(module(), datamodule=datamodule())[0]["val_loss"]
    ours = _trainer(tmp_path / "ours", 1).validate(Regression(), datamodule=FitOnlyTrainData())[0]["val_loss"]
    assert ours == pytest.approx(expected, rel=1e-6)
