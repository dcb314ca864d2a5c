"""Callbacks: code that watches a run (and may stop it) without being part of the model.

``Trainer(callbacks=[LearningRateMonitor(), EarlyStopping(monitor="val/loss")])``, or from the
command line ``python train.py callbacks=[lr_monitor,early_stopping]`` (``conf/callbacks/``).
The hook order is documented once, in ``trainer/api/callback.py``.

Files: ``base.py`` (the ``Callback`` interface and the hook order), ``callback_list.py`` (one run's
callbacks: calling them in order, stop requests, their checkpoint state), ``hook_shapes.py`` (refuses
a callback whose hooks have the earlier shapes), and one file per built-in callback: ``lr_monitor.py``
(``LearningRateMonitor``), ``early_stopping.py`` (``EarlyStopping``), ``timer.py`` (``Timer``), ``model_checkpoint.py`` (Lightning's ``ModelCheckpoint``, as checkpoint settings,
and Lightning's default checkpointing).
"""

from trainer.api.callback import Callback, run_of
from trainer.callbacks.callback_list import CallbackList, check_callbacks
from trainer.callbacks.early_stopping import EarlyStopping
from trainer.callbacks.lr_monitor import LearningRateMonitor
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.callbacks.timer import Timer, parse_duration

__all__ = [
    "Callback",
    "CallbackList",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "Timer",
    "check_callbacks",
    "parse_duration",
    "run_of",
]
