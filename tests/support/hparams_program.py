"""A Lightning program in its documented hyperparameter idioms (tests/unit/api/test_hparams_objects.py
runs it under Lightning itself and, its import line rewritten, under this trainer): a ``functools.partial``
optimizer and an ``nn.Module`` passed to ``__init__`` and kept by ``save_hyperparameters()``, objects
added to ``self.hparams`` afterwards, and a DataModule that saves its own hyperparameters."""

import functools

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L


class Net(nn.Module):
    def __init__(self, width=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, x):
        return self.body(x)


class Client:
    """Something built with a secret (a partial of it is a hyperparameter)."""

    def __init__(self, api_key, retries=3):
        self.api_key, self.retries = api_key, retries


class Data(L.LightningDataModule):
    def __init__(self, batch_size=4, samples=16, scale=(1.0, 2.0)):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.hparams.samples, 3, generator=generator) * self.hparams.scale[0]
        y = x.sum(dim=1, keepdim=True) * self.hparams.scale[1]
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)


class Lit(L.LightningModule):
    def __init__(self, net, optimizer, activation=nn.Tanh, betas=(0.9, 0.99), client=None, note="plain"):
        super().__init__()
        self.save_hyperparameters()
        self.net = net
        self.hparams.loss = nn.MSELoss()  # added after save_hyperparameters: kept too
        self.hparams.scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.hparams.loss(self(x), y)

    def configure_optimizers(self):
        return self.hparams.optimizer(self.parameters(), betas=self.hparams.betas)


def build(client=None):
    """The module and datamodule the tests train."""
    torch.manual_seed(0)
    return Lit(Net(width=5), functools.partial(torch.optim.AdamW, lr=1e-3), client=client), Data()
