"""Lightning's ``LearningRateMonitor(logging_interval, log_momentum, log_weight_decay)`` over this
trainer's `LearningRateMonitor`."""

from __future__ import annotations

import logging

from trainer.callbacks import LearningRateMonitor as _LearningRateMonitor
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


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
