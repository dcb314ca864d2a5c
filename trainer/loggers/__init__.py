"""Metric sinks, written by rank 0 only; several at once (``logger=[tensorboard,wandb,csv]``).

``metrics.jsonl`` is a contract other tools rely on: one JSON object per line with at least
``step`` (optimizer steps done) and the logged values.

Backends are imported only when used (TensorBoard costs ~0.2 s to import, W&B ~0.45 s). Every
config a backend records goes through `redact_secrets` first.

===============  ==================================  =========================================
name             class                               writes
===============  ==================================  =========================================
``jsonl``        `JSONLLogger`                ``<run_dir>/metrics.jsonl``, hparams.yaml
``csv``          `CSVLogger`                  ``<run_dir>/metrics.csv`` (one row a step),
                                                     hparams.yaml
``tensorboard``  `TensorBoardLogger`          ``<run_dir>/events.out.tfevents.*``
``wandb``        `WandbLogger`                ``<run_dir>/wandb/``, one run per job
``mlflow``       `MLFlowLogger`               an MLflow tracking server or local store, one
                                                     run per job (id in ``<run_dir>/mlflow_run_id``)
===============  ==================================  =========================================

Lightning's constructors work too (``TensorBoardLogger(save_dir, name="lightning_logs", version=None)``,
``CSVLogger(save_dir, ...)``, ``WandbLogger(name=None, save_dir=".", ...)``): they write into
``<save_dir>/<name>/version_<n>`` as Lightning's do; ``Trainer(logger=...)`` takes them. Every rank
holds the run's logger objects; only rank 0's write (elsewhere ``experiment`` is a
`DummyExperiment` that accepts any call).

Files: ``base.py`` (the ``Logger`` interface, ``DummyExperiment``), ``versions.py`` (Lightning's version folders), ``registry.py`` (names -> backends; the accepted forms
of ``Trainer(loggers=...)``), one file per backend (``jsonl_logger.py``, ``csv_logger.py``,
``tensorboard_logger.py`` (its graph: ``tensorboard_graph.py``), ``wandb_logger.py``, ``mlflow_logger.py``; ``mlflow_store.py``: where an
MLflow run is kept and what it holds), ``hparams_file.py`` (``hparams.yaml`` of the file
loggers), ``redact.py`` (secrets kept out of everything a logger writes), ``resume_history.py`` (on
resume, every logger back at the checkpoint: nothing after it twice, nothing before it missing, filled
from metrics.jsonl), ``wandb_history.py`` (the steps a W&B run's files hold).
"""

from trainer.loggers.base import Logger
from trainer.loggers.csv_logger import CSVLogger
from trainer.loggers.jsonl_logger import JSONLLogger
from trainer.loggers.mlflow_logger import MLFlowLogger
from trainer.runtime.redact import redact_secrets
from trainer.loggers.base import DummyExperiment, DummyLogger
from trainer.loggers.registry import (
    DEFAULT_LOGGERS, LOGGERS, LoggerSpec, agree_versions, build_loggers, choose_loggers, resolve_logger_specs,
    settle_versions,
)
from trainer.loggers.tensorboard_logger import TensorBoardLogger
from trainer.loggers.wandb_logger import WandbLogger
from trainer.loggers.wandb_run_id import adopt_run_id

__all__ = [
    "DEFAULT_LOGGERS",
    "LOGGERS",
    "CSVLogger",
    "DummyExperiment",
    "DummyLogger",
    "JSONLLogger",
    "Logger",
    "LoggerSpec",
    "MLFlowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "adopt_run_id",
    "agree_versions",
    "build_loggers",
    "choose_loggers",
    "redact_secrets",
    "resolve_logger_specs",
    "settle_versions",
]
