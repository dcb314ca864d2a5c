"""A program of our own written with Lightning's LightningCLI: a model, a datamodule and a callback,
all configured from the command line / a config file. It imports only ``lightning`` and ``torch``; the
tests run it under Lightning as written and under this trainer with its imports rewritten
(``tests.support.lightning_as_ours.regression_cli``; tests/support/lightning_cli_runs.py).

``LossRecorder(path)`` writes ``path``: rank 0's per-step ``train_loss`` (the logged value), the
``test_loss`` and, after fit, the trained weights to ``path + ".pt"``; ``Regressor(init_weights=...)``
starts from such weights (so that ``test`` after ``fit`` tests the trained model).
"""

import json

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningCLI


class Regressor(LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1, init_weights: str = ""):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
        if init_weights:
            self.net.load_state_dict(torch.load(init_weights))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class RegressionData(LightningDataModule):
    def __init__(self, batch_size: int = 8, samples: int = 64):
        super().__init__()
        self.batch_size = batch_size
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(samples, 4, generator=generator)
        y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(samples, 1, generator=generator)
        self.data = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class LossRecorder(Callback):
    def __init__(self, path: str):
        self.path = path
        self.record = {"train_loss": []}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            self.record["train_loss"].append(float(trainer.callback_metrics["train_loss"]))

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            torch.save(pl_module.net.state_dict(), self.path + ".pt")
            self._write()

    def on_test_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.record["test_loss"] = float(trainer.callback_metrics["test_loss"])
            self._write()

    def _write(self):
        with open(self.path, "w") as f:
            json.dump(self.record, f)


def main(args=None):
    return LightningCLI(Regressor, RegressionData, args=args)
