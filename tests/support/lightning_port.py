"""A LightningModule as a Lightning 2.x user writes it, ported by changing two lines only:

    -import lightning as L
    +from trainer import TrainModule
    ...
    -class LitRegressor(L.LightningModule):
    +class LitRegressor(TrainModule):

Everything else below is plain Lightning code (tests/multiprocess/api/test_lightning_port.py runs it).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule

FEATURES = 6
# Sizes that divide neither by the batch nor by 2 ranks: short last batches, uneven shards.
TRAIN_SAMPLES, VAL_SAMPLES, TEST_SAMPLES, PREDICT_SAMPLES = 203, 61, 53, 37


def make_data(num_samples, seed):
    """Fixed regression data, independent of the global RNG."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, FEATURES, generator=generator)
    w = torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    y = torch.sin(x @ w) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return x, y


class LitRegressor(TrainModule):
    def __init__(self, hidden=16, lr=0.05, batch_size=16):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, self.hparams.hidden),
            nn.Tanh(),
            nn.Linear(self.hparams.hidden, 1),
        )
        self.epochs_ended = 0
        self.validations_ended = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        self.log("val_loss", F.mse_loss(prediction, y), prog_bar=True)
        self.log("val_mae", (prediction - y).abs().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        (x,) = batch
        return self(x)

    def on_train_epoch_end(self):
        self.epochs_ended += 1

    def on_validation_epoch_end(self):
        self.validations_ended += 1

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}

    def train_dataloader(self):
        x, y = make_data(TRAIN_SAMPLES, seed=1)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        x, y = make_data(VAL_SAMPLES, seed=2)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        x, y = make_data(TEST_SAMPLES, seed=3)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        x, _ = make_data(PREDICT_SAMPLES, seed=4)
        return DataLoader(TensorDataset(x), batch_size=self.hparams.batch_size)
