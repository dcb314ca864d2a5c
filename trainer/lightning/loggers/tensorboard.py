"""Lightning's ``lightning.pytorch.loggers.tensorboard``: ``TensorBoardLogger`` (see ``__init__.py``)."""

from trainer.lightning.loggers import TensorBoardLogger

__all__ = ["TensorBoardLogger"]
