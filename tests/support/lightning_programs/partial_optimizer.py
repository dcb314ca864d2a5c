"""The lightning-hydra-template module shape: the network (an ``nn.Module``) and ``functools.partial``
optimizer and scheduler factories are given to ``__init__`` and kept with ``save_hyperparameters``;
``configure_optimizers`` builds them from ``self.hparams``. No checkpoint callback is configured (so
Lightning's default one saves at every epoch's end), and the checkpoint rebuilds the module with
``load_from_checkpoint(path)`` and no arguments. The module adds a callback with ``configure_callbacks``
and steps its scheduler in ``lr_scheduler_step``.
"""

from functools import partial

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 6
GLOBAL_BATCH = 8


class Backbone(nn.Module):
    def __init__(self, features: int = FEATURES, hidden: int = 12):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.layers(x)


def points(samples, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(x, (x[:, :3].prod(dim=1, keepdim=True) > 0).float())


class FactoryModule(pl.LightningModule):
    def __init__(self, net: nn.Module, optimizer, scheduler=None):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = net
        self.stages = []

    def setup(self, stage):
        self.stages.append(stage)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.binary_cross_entropy_with_logits(self(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.binary_cross_entropy_with_logits(self(x), y), prog_bar=True)

    def configure_callbacks(self):
        return [EarlyStopping(monitor="val/loss", mode="min", patience=5)]

    def lr_scheduler_step(self, scheduler, metric):
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_optimizers(self):
        optimizer = self.hparams.optimizer(params=self.parameters())
        if self.hparams.scheduler is None:
            return {"optimizer": optimizer}
        scheduler = self.hparams.scheduler(optimizer=optimizer)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch", "frequency": 1}}


def main(root_dir, devices=1, strategy="auto", callbacks=(), instrument=lambda obj: obj):
    """Fit with Lightning's default checkpointing; rebuild the module from the saved checkpoint."""
    pl.seed_everything(3)
    model = instrument(FactoryModule(
        net=Backbone(),
        optimizer=partial(torch.optim.AdamW, lr=0.02, weight_decay=0.01),
        scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5),
    ))
    batch_size = GLOBAL_BATCH // devices
    trainer = pl.Trainer(
        default_root_dir=root_dir, accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2,
        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
    )
    trainer.fit(model, train_dataloaders=DataLoader(points(16, seed=1), batch_size=batch_size),
                val_dataloaders=DataLoader(points(16, seed=2), batch_size=batch_size))
    saved = trainer.checkpoint_callback.best_model_path
    # the checkpoint holds the network and the partials themselves: not a weights-only file
    restored = FactoryModule.load_from_checkpoint(saved, weights_only=False)
    return {
        "model": model,
        "fit": dict(trainer.callback_metrics),
        "checkpoint_file": saved[len(root_dir):],
        "restored": restored,
        "restored_optimizer": {"type": type(restored.hparams.optimizer).__name__,
                               "func": restored.hparams.optimizer.func.__name__,
                               "keywords": restored.hparams.optimizer.keywords},
        "restored_net_type": type(restored.hparams.net).__name__,
        "restored_net_is_net": restored.hparams.net is restored.net,
        "process_local": {"stages": model.stages},
    }
