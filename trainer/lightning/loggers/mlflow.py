"""Lightning's ``lightning.pytorch.loggers.mlflow``: ``MLFlowLogger`` (see ``__init__.py``)."""

from trainer.lightning.loggers import MLFlowLogger

__all__ = ["MLFlowLogger"]
