"""Lightning's ``lightning.pytorch.loggers.wandb``: ``WandbLogger`` (see ``__init__.py``)."""

from trainer.lightning.loggers import WandbLogger

__all__ = ["WandbLogger"]
