"""A program of our own, written as a Lightning user writes one (``import lightning``, LightningCLI as its
command line); tests/multiprocess/api/test_lightning_example_harness.py runs it through
bench/_lightning_example_harness.py with its imports rewritten, as the examples bench runs Lightning's
programs. Its data is fixed (a seeded generator) and its loader does not shuffle: the per-step losses of
2 ranks can equal one process's on the same global batch."""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.cli import LightningCLI


class Regressor(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class RegressionData(L.LightningDataModule):
    def __init__(self, batch_size: int = 4, samples: int = 48):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage):
        generator = torch.Generator().manual_seed(3)
        x = torch.randn(self.hparams.samples, 6, generator=generator)
        self.train_set = TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size)


if __name__ == "__main__":
    LightningCLI(Regressor, RegressionData, seed_everything_default=7)
