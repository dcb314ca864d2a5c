"""Lightning's ``lightning.pytorch.core``: ``LightningModule`` (``module.py``), ``LightningDataModule``
(``datamodule.py``) and ``optimizer.LightningOptimizer`` (``optimizer.py``)."""

from trainer.lightning._missing import missing_names
from trainer.lightning.core.datamodule import LightningDataModule
from trainer.lightning.core.module import LightningModule

__all__ = ["LightningDataModule", "LightningModule"]

__getattr__ = missing_names(__name__, {
    "CheckpointHooks": "the hooks of trainer.lightning.LightningModule (they are its methods)",
    "DataHooks": "the hooks of trainer.lightning.LightningModule (they are its methods)",
    "ModelHooks": "the hooks of trainer.lightning.LightningModule (they are its methods)",
})
