"""The two Lightning names tests/support/metrics_program.py uses, as this trainer's classes."""

from trainer import TrainModule as LightningModule  # noqa: F401
from trainer.callbacks import Callback  # noqa: F401
