"""Monitored callbacks and schedulers: ``ModelCheckpoint(monitor="val_loss", save_top_k=1)``,
``EarlyStopping`` on the same metric (it stops the run before ``max_epochs``), a ``ReduceLROnPlateau``
scheduler with a ``monitor`` in the dict ``configure_optimizers`` returns (it halves the learning rate
once), dataloaders given to ``fit`` directly, and the best checkpoint read back with
``load_from_checkpoint(best_model_path)`` and tested. The module overrides ``optimizer_step`` (a
learning-rate warm-up), ``optimizer_zero_grad`` and ``configure_gradient_clipping`` (clipping by norm
with ``self.clip_gradients``).
"""

import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 4
GLOBAL_BATCH = 8
WARMUP_STEPS = 2


def waves(samples, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))


class PlateauRegressor(L.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y))

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        # learning-rate warm-up over the first two steps, then the optimizer's own step
        if self.trainer.global_step < WARMUP_STEPS:
            for group in optimizer.param_groups:
                group["lr"] = self.hparams.lr * (self.trainer.global_step + 1) / WARMUP_STEPS
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        # any epoch that does not improve val_loss by a whole unit halves the learning rate
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=0.5, patience=0, threshold=1.0, threshold_mode="abs")
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss", "interval": "epoch", "frequency": 1}}


def main(root_dir, devices=1, strategy="auto", callbacks=(), instrument=lambda obj: obj):
    """Fit until EarlyStopping ends the run; load the best checkpoint and test it."""
    L.seed_everything(5)
    model = instrument(PlateauRegressor())
    batch_size = GLOBAL_BATCH // devices
    train_loader = DataLoader(waves(16, seed=1), batch_size=batch_size, shuffle=False)
    val_loader = DataLoader(waves(16, seed=2), batch_size=batch_size, shuffle=False)
    test_loader = DataLoader(waves(8, seed=3), batch_size=batch_size, shuffle=False)
    checkpoint = ModelCheckpoint(dirpath=os.path.join(root_dir, "checkpoints"), filename="best-{epoch}",
                                 monitor="val_loss", mode="min", save_top_k=1)
    # min_delta larger than any change: the first epoch improves, the next two do not, and it stops
    early_stopping = EarlyStopping(monitor="val_loss", mode="min", patience=2, min_delta=10.0)
    trainer = L.Trainer(
        default_root_dir=root_dir, accelerator="cpu", devices=devices, strategy=strategy, max_epochs=6,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[checkpoint, early_stopping, *callbacks],
    )
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)
    best = PlateauRegressor.load_from_checkpoint(checkpoint.best_model_path)
    return {
        "model": model,
        "fit": dict(trainer.callback_metrics),
        "epochs_run": trainer.current_epoch,
        "best_file": os.path.basename(checkpoint.best_model_path),
        "best_score": checkpoint.best_model_score,
        "best": best,
        "test_best": trainer.test(best, dataloaders=test_loader),
    }
