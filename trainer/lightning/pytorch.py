"""``trainer.lightning.pytorch``: the same names as ``trainer.lightning`` (Lightning's ``lightning.pytorch``
under ``lightning``), so that ``import lightning as L; L.pytorch.callbacks.ModelCheckpoint`` ports as is."""

from trainer.lightning import (Callback, LightningDataModule, LightningModule, Trainer, callbacks, cli_lightning_logo,
                               core, loggers, seed_everything, utilities)

__all__ = ["Callback", "LightningDataModule", "LightningModule", "Trainer", "callbacks", "cli_lightning_logo", "core", "loggers",
           "seed_everything", "utilities"]
