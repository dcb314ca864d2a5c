"""Lightning's ``EarlyStopping(monitor, min_delta, patience, verbose, mode, ...)`` over this trainer's
`EarlyStopping`: a Lightning program's positional and keyword arguments mean
here what they mean there; one whose meaning the trainer cannot give is an error naming what to use."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from trainer.callbacks import EarlyStopping as _EarlyStopping


class EarlyStoppingReason(Enum):
    """Why an ``EarlyStopping`` stopped the run (its ``stopping_reason``), with Lightning's values."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``: stops when ``monitor`` has not improved by more than ``min_delta``
    for ``patience`` checks, at each validation's end, or with ``check_on_train_epoch_end=True`` at each
    training epoch's end (on what was logged); ``stopping_threshold`` / ``divergence_threshold`` stop at
    once; ``strict=False`` warns once about a missing monitor and skips the check."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False):
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta,
                         check_finite=check_finite, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, strict=strict,
                         check_on_train_epoch_end=check_on_train_epoch_end)
        self.verbose = verbose  # the reason to stop is always logged (rank 0)
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None

    def _reason_to_stop(self, value: float, step: int) -> str | None:
        message = super()._reason_to_stop(value, step)
        if message is not None:  # which check stopped it, in the order the checks are made
            if self.check_finite and not math.isfinite(value):
                self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            elif self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
                self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            elif self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
                self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            else:
                self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            self.stopping_reason_message = message
        return message

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state.get("stopping_reason_message")
