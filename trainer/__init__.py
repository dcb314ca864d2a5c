"""A PyTorch training framework: ``Trainer`` runs a ``TrainModule`` with a strategy plugin."""

from trainer.data import seed_everything
from trainer.datamodule import DataModule
from trainer.distributed import rank_zero_first
from trainer.module import TrainModule
from trainer.trainer import Trainer

__all__ = ["DataModule", "Trainer", "TrainModule", "rank_zero_first", "seed_everything"]
__version__ = "0.1.0"
