"""Lightning's ``lightning.pytorch.loggers``: ``Logger`` (the interface), ``TensorBoardLogger``,
``CSVLogger``, ``WandbLogger`` and ``MLFlowLogger`` are this trainer's (trainer/loggers/), also under
Lightning's module names (``logger.py``, ``tensorboard.py``, ``csv_logs.py``, ``wandb.py``,
``mlflow.py``); the other Lightning loggers
are an ImportError saying what to use."""

from trainer.lightning._missing import missing_names
from trainer.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

__all__ = ["CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]

_OWN = "a subclass of trainer.lightning.loggers.Logger (log_metrics, log_hyperparams) in the Trainer's loggers"
__getattr__ = missing_names(__name__, {
    "CometLogger": _OWN, "LitLogger": _OWN, "NeptuneLogger": _OWN,
})
