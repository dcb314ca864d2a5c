"""Lightning's ``lightning.pytorch.callbacks.model_checkpoint``: ``ModelCheckpoint`` with Lightning's
arguments, over this trainer's checkpoints (``trainer/callbacks/model_checkpoint.py``)."""

from trainer.callbacks.model_checkpoint import ModelCheckpoint

__all__ = ["ModelCheckpoint"]
