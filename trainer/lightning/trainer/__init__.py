"""Lightning's ``lightning.pytorch.trainer``: ``Trainer`` (``trainer.py``: this trainer with
Lightning's defaults), ``states`` (``states.py``: ``TrainerFn``, ``RunningStage``, ``TrainerStatus``,
``TrainerState``) and ``seed_everything``, under Lightning's module names."""

from trainer.lightning.seed import seed_everything
from trainer.lightning.trainer import states
from trainer.lightning.trainer.trainer import Trainer

__all__ = ["Trainer", "seed_everything", "states"]
