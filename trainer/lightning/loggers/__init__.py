"""Lightning's ``lightning.pytorch.loggers``: ``Logger`` (the interface), ``TensorBoardLogger``,
``CSVLogger`` and ``WandbLogger`` are this trainer's (trainer/loggers/), also under Lightning's module
names (``logger.py``, ``tensorboard.py``, ``csv_logs.py``, ``wandb.py``); the other Lightning loggers
are an ImportError saying what to use."""

from trainer.lightning._missing import missing_names
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "WandbLogger"]

_OWN = "a subclass of trainer.lightning.loggers.Logger (log_metrics, log_hyperparams) in the Trainer's loggers"
__getattr__ = missing_names(__name__, {
    "CometLogger": _OWN, "LitLogger": _OWN, "MLFlowLogger": _OWN, "NeptuneLogger": _OWN,
})
