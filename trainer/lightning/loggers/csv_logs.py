"""Lightning's ``lightning.pytorch.loggers.csv_logs``: ``CSVLogger`` (see ``__init__.py``)."""

from trainer.lightning.loggers import CSVLogger

__all__ = ["CSVLogger"]
