"""The two Lightning names tests/support/metrics_program.py uses, as this trainer's classes."""

from trainer import TrainModule as LightningModule
from trainer.callbacks import Callback

__all__ = ["Callback", "LightningModule"]
