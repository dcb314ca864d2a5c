"""The built-in callbacks with Lightning's constructor arguments, mapped onto this trainer's callbacks.

Lightning orders and names some arguments differently (``EarlyStopping(monitor, min_delta, patience,
verbose, mode, ...)``, ``Timer(duration, interval)``): a Lightning program's positional and keyword
arguments mean here what they mean there. An argument whose meaning this trainer cannot give is an
error naming what to use; one that only changes what is printed is accepted (the trainer's messages
are always shown on rank 0).
"""

from __future__ import annotations

import logging
from typing import Any

from trainer.callbacks import EarlyStopping as _EarlyStopping
from trainer.callbacks import LearningRateMonitor as _LearningRateMonitor
from trainer.callbacks import Timer as _Timer
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``: stops when ``monitor`` (a validation metric) has not improved by
    more than ``min_delta`` for ``patience`` validations; checked at each validation's end."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False):
        if divergence_threshold is not None:
            raise ValueError(f"EarlyStopping(divergence_threshold={divergence_threshold!r}) does not exist here; "
                             "use check_finite=True (stops on NaN / inf) or stopping_threshold=")
        if check_on_train_epoch_end:
            raise ValueError("EarlyStopping(check_on_train_epoch_end=True): this trainer checks at the end of each "
                             "validation only; leave it None and validate each epoch (check_val_every_n_epoch=1)")
        if not strict:
            raise ValueError("EarlyStopping(strict=False): a monitor missing from the validation metrics is always "
                             "an error here (it lists the metrics there are); log the metric, or fix its name")
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta,
                         check_finite=check_finite, stopping_threshold=stopping_threshold)
        self.verbose = verbose  # the reason to stop is always logged (rank 0)


class Timer(_Timer):
    """Lightning's ``Timer``: stops training once it has run for ``duration`` ("DD:HH:MM:SS", a
    timedelta or a dict of timedelta arguments), checked after every step (``interval="step"``)."""

    def __init__(self, duration: Any = None, interval: str = "step", verbose: bool = True):
        if duration is None:
            raise ValueError("Timer(duration=None) only measures time under Lightning; this Timer stops a run: give "
                             "duration= ('DD:HH:MM:SS', a timedelta or {'hours': ...}), or remove the callback")
        if interval != "step":
            raise ValueError(f"Timer(interval={interval!r}): this trainer checks the time after optimizer steps; "
                             "use interval='step'")
        super().__init__(max_time=duration, check_every_n_steps=1)
        self.verbose = verbose  # the stop reason is always logged (rank 0)


class LearningRateMonitor(_LearningRateMonitor):
    """Lightning's ``LearningRateMonitor``: logs each parameter group's learning rate (and momentum,
    weight decay) on logging steps (metric names: ``trainer/callbacks/lr_monitor.py``)."""

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False):
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"LearningRateMonitor(logging_interval={logging_interval!r}): use None, 'step' or 'epoch'")
        if logging_interval == "epoch":
            rank_zero_warn(log, "LearningRateMonitor(logging_interval='epoch'): the learning rates are logged on "
                           "logging steps (Trainer(log_every_n_steps=...)), not once per epoch")
        super().__init__(log_momentum=log_momentum, log_weight_decay=log_weight_decay)
        self.logging_interval = logging_interval
