"""Lightning's ``EarlyStopping(monitor, min_delta, patience, verbose, mode, ...)`` over this trainer's
`EarlyStopping`: a Lightning program's positional and keyword arguments mean
here what they mean there, and it reads and sets Lightning's attributes (``wait_count``,
``best_score``, ``stopped_epoch``, ``stopping_reason``, ``state_key``, ``state_dict()``); one
argument whose meaning the trainer cannot give is an error naming what to use."""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Callable

import torch

from trainer.api.callback import run_of
from trainer.api.errors import MisconfigurationException
from trainer.callbacks import EarlyStopping as _EarlyStopping
from trainer.runtime import distributed

log = logging.getLogger(__name__)


class EarlyStoppingReason(Enum):
    """Why an ``EarlyStopping`` stopped the run (its ``stopping_reason``), with Lightning's values."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``: stops when ``monitor`` has not improved by more than ``min_delta``
    for ``patience`` checks (``patience=0`` stops at the first check without improvement, as 1 does).

    When it checks: ``check_on_train_epoch_end=True`` at each training epoch's end (on what was
    logged, a training metric may be the monitor), False at each validation's end; None (the
    default) as Lightning decides: at the training epoch's end when validation runs once per epoch
    (``val_check_interval`` unset or 1.0 and ``check_val_every_n_epoch=1``), else at each
    validation's end. ``stopping_threshold`` / ``divergence_threshold`` and a non-finite value stop
    at once; ``strict=False`` warns once about a missing monitor and skips the check. Every check goes
    through ``_evaluate_stopping_criteria(current)`` (a tensor), which returns ``(should_stop,
    reason)`` as Lightning's does. ``verbose``: each check's reason is logged at INFO (rank 0 only with
    ``log_rank_zero_only``); the reason to stop is always logged."""

    mode_dict = {"min": torch.lt, "max": torch.gt}

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False):
        if mode not in self.mode_dict:
            raise MisconfigurationException(f"EarlyStopping: `mode` can be {', '.join(self.mode_dict)}, got {mode}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise MisconfigurationException(f"EarlyStopping: `patience` must be an integer >= 0, got {patience!r}")
        super().__init__(monitor=monitor, mode=mode, patience=max(patience, 1), min_delta=abs(min_delta),
                         check_finite=check_finite, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, strict=strict,
                         check_on_train_epoch_end=check_on_train_epoch_end)
        self.patience = patience  # (0 stops where 1 does: the count reaches 1 at the first miss)
        self._check_on_train_epoch_end = check_on_train_epoch_end  # None: decided when the fit starts
        self.verbose, self.log_rank_zero_only = verbose, log_rank_zero_only
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None

    # ----- Lightning's names for the base's state ----------------------------------------------------------
    @property
    def state_key(self) -> str:
        return f"{type(self).__qualname__}{ {'monitor': self.monitor, 'mode': self.mode}!r}"

    @property
    def monitor_op(self) -> Callable:
        return self.mode_dict[self.mode]

    @property
    def wait_count(self) -> int:
        """Checks in a row without improvement."""
        return self.wait

    @wait_count.setter
    def wait_count(self, value: int) -> None:
        self.wait = int(value)

    @property
    def best_score(self) -> torch.Tensor:
        """The best value so far (a tensor, as Lightning keeps it)."""
        return torch.tensor(self.best)

    @best_score.setter
    def best_score(self, value: Any) -> None:
        self.best = float(value)

    # ----- when and how it checks --------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if self._check_on_train_epoch_end is None:  # Lightning's rule: once-per-epoch validation -> epoch end
            fraction = getattr(trainer, "val_check_fraction", None)
            self.check_on_train_epoch_end = (getattr(trainer, "val_every_n_steps", None) is None
                                             and fraction in (None, 1.0)
                                             and getattr(trainer, "check_val_every_n_epoch", None) == 1)
        super().on_fit_start(trainer, module)

    def _check(self, trainer: Any, metrics: Any, what: str) -> None:
        stopped = self.stopped_step
        super()._check(trainer, metrics, what)
        if self.stopped_step != stopped:
            self.stopped_epoch = run_of(trainer).epoch

    def _reason_to_stop(self, value: float, step: int) -> str | None:
        best = self.best
        should_stop, reason = self._evaluate_stopping_criteria(torch.tensor(value))
        if self.best != best:
            self.best_step = step
        if reason and self.verbose and (not self.log_rank_zero_only or distributed.rank() == 0):
            log.info(reason)
        if not should_stop:
            return None
        self.stopping_reason_message = reason
        return reason or f"EarlyStopping(monitor={self.monitor!r}) asked to stop"

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """``(should_stop, reason)`` for the monitor's ``current`` value; updates the best value, the
        count and ``stopping_reason``."""
        value, order = float(current), "<" if self.mode == "min" else ">"
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {self.monitor} = {value} is not finite (best so far {self.best:.3f}); "
                          "stopping")
        if self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {self.monitor} = {value} {order} {self.stopping_threshold}; "
                          "stopping")
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {self.monitor} = {value} {order} "
                          f"{self.divergence_threshold}; stopping")
        shifted = value + self.min_delta if self.mode == "min" else value - self.min_delta
        if self._better(shifted, self.best):
            message = f"Metric {self.monitor} improved to {value:.3f} (best before {self.best:.3f})"
            self.best, self.wait = value, 0
            return False, message
        self.wait += 1
        if self.wait < max(self.patience, 1):
            return False, None
        self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
        return True, (f"Monitored metric {self.monitor} did not improve in the last {self.wait} records "
                      f"(best {self.best:.3f}); stopping")

    # ----- checkpoint state: Lightning's keys, and the base's --------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message,
                "best_step": self.best_step, "stopped_step": self.stopped_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Lightning's state (also one saved before it had ``stopping_reason``) or the base's."""
        if "best" in state:  # the base's keys
            super().load_state_dict(state)
        else:
            self.wait, self.best = int(state["wait_count"]), float(state["best_score"])
            self.best_step, self.stopped_step = state.get("best_step"), state.get("stopped_step")
        self.stopped_epoch = int(state.get("stopped_epoch", 0))
        self.patience = int(state.get("patience", self.patience))
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state.get("stopping_reason_message")
