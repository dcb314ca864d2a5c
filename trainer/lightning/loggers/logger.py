"""Lightning's ``lightning.pytorch.loggers.logger``: ``Logger`` (see ``__init__.py``)."""

from trainer.lightning.loggers import Logger

__all__ = ["Logger"]
