"""A DataModule as Lightning's documentation writes one: ``save_hyperparameters``, data written once by
``prepare_data`` and read back in ``setup(stage)``, the per-device batch size derived from
``self.trainer.world_size`` (the hyperparameter is the global batch), ``teardown(stage)``, and
``state_dict`` / ``load_state_dict`` that a checkpoint carries, and its own batch transfer hooks. The module logs its loss with the most
common line of all, ``self.log("train_loss", loss)`` in a ``training_step`` that returns it, and its
``predict_step`` takes no ``batch_idx``.
"""

import os

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 4
GLOBAL_BATCH = 8
INPUT_SCALE = 0.5
SPLITS = {"train": 16, "val": 16, "test": 8, "predict": 8}


class StoredPointsDataModule(pl.LightningDataModule):
    def __init__(self, data_dir: str, batch_size: int = GLOBAL_BATCH):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.batch_size_per_device = batch_size
        self.datasets = {}
        self.stages_set_up, self.stages_torn_down = [], []
        self.restored_state = None

    @property
    def data_file(self):
        return os.path.join(self.hparams.data_dir, "points.pt")

    def prepare_data(self):
        # once per node: write the data set that setup() reads
        if os.path.exists(self.data_file):
            return
        os.makedirs(self.hparams.data_dir, exist_ok=True)
        generator = torch.Generator().manual_seed(3)
        total = sum(SPLITS.values())
        x = torch.randn(total, FEATURES, generator=generator)
        y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.25]]) + 0.1 * torch.randn(total, 1, generator=generator)
        torch.save({"x": x, "y": y}, self.data_file)

    def setup(self, stage):
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(f"batch size {self.hparams.batch_size} is not divisible by the number of "
                                   f"devices {self.trainer.world_size}")
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if not self.datasets:
            data = torch.load(self.data_file)
            start = 0
            for split, count in SPLITS.items():
                self.datasets[split] = TensorDataset(data["x"][start:start + count], data["y"][start:start + count])
                start += count
        self.stages_set_up.append(stage)

    def teardown(self, stage):
        self.stages_torn_down.append(stage)

    def state_dict(self):
        return {"setups": len(self.stages_set_up), "batch_size_per_device": self.batch_size_per_device}

    def load_state_dict(self, state_dict):
        self.restored_state = dict(state_dict)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        # the DataModule's batch hooks run instead of the module's: inputs scaled before the move
        return [batch[0] * INPUT_SCALE, *batch[1:]]

    def on_after_batch_transfer(self, batch, dataloader_idx):
        return [tensor.contiguous() for tensor in batch]

    def _loader(self, split):
        return DataLoader(self.datasets[split], batch_size=self.batch_size_per_device, shuffle=False)

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")

    def predict_dataloader(self):
        return DataLoader(TensorDataset(self.datasets["predict"].tensors[0]), batch_size=self.batch_size_per_device)


class LinearRegressor(pl.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(FEATURES, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def predict_step(self, batch):
        (x,) = batch
        return self(x)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(root_dir, devices=1, strategy="auto", callbacks=(), instrument=lambda obj: obj):
    """Fit, then test from the last checkpoint (which restores the DataModule's state) and predict."""
    pl.seed_everything(11)
    datamodule = instrument(StoredPointsDataModule(data_dir=os.path.join(root_dir, "data")))
    model = instrument(LinearRegressor())
    checkpoints = ModelCheckpoint(dirpath=os.path.join(root_dir, "checkpoints"), save_last=True)
    trainer = pl.Trainer(
        default_root_dir=root_dir, accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[checkpoints, *callbacks],
    )
    trainer.fit(model, datamodule=datamodule)
    return {
        "model": model,
        "fit": dict(trainer.callback_metrics),
        "test": trainer.test(model, datamodule=datamodule, ckpt_path="last"),
        "predict": trainer.predict(model, datamodule=datamodule),
        "last_checkpoint": os.path.basename(checkpoints.last_model_path),
        # what the DataModule object saw: only where it ran (not in spawned ranks)
        "process_local": {
            "batch_size_per_device": datamodule.batch_size_per_device,
            "stages_set_up": datamodule.stages_set_up,
            "stages_torn_down": datamodule.stages_torn_down,
            "restored_state": datamodule.restored_state,
        },
    }
