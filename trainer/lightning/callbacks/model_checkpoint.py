"""Lightning's ``lightning.pytorch.callbacks.model_checkpoint``: ``ModelCheckpoint`` (see ``__init__.py``)."""

from trainer.lightning.callbacks import _MISSING
from trainer.lightning._missing import missing_names

if "ModelCheckpoint" not in _MISSING:
    from trainer.lightning.callbacks import ModelCheckpoint  # noqa: F401

__getattr__ = missing_names("trainer.lightning.callbacks", _MISSING)
