"""EarlyStopping: stop when a validation metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import Any

from trainer.api.callback import Callback, run_of
from trainer.api.trainer_arguments import validates_during_training
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)

MODES = ("min", "max")


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved for ``patience`` validations in a row.

    It reads the validation metrics in ``on_validation_end``. They are reduced over all ranks, so
    every rank takes the same decision at the same step without any extra collective. Validate
    regularly (``trainer.val_every_n_steps``): a check happens once per validation.

    Args:
        monitor: a validation metric as logged, e.g. "val/loss" or "val/accuracy". A name missing
            from the validation metrics is an error that lists the ones there are.
        mode: "min" (lower is better) or "max".
        patience: validations without improvement after which training stops (>= 1).
        min_delta: an improvement must beat the best value by more than this (>= 0).
        check_finite: stop as soon as the metric is NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this (e.g. a target loss).
        divergence_threshold: stop as soon as the metric is worse than this (a diverging run).
        strict: a monitor missing from the metrics is an error (True); False: one warning, and that
            check is skipped.
        check_on_train_epoch_end: True: check at the end of each training epoch, on
            ``trainer.callback_metrics`` (the epoch's logged values, a training metric may be the
            monitor); False / None: at the end of each validation.
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        strict: bool = True,
        check_on_train_epoch_end: bool | None = None,
    ):
        for name, flag in (("strict", strict), ("check_on_train_epoch_end", check_on_train_epoch_end)):
            if not isinstance(flag, bool) and not (flag is None and name == "check_on_train_epoch_end"):
                raise ValueError(f"EarlyStopping {name}={flag!r}: give True or False")
        if mode not in MODES:
            raise ValueError(f"EarlyStopping mode={mode!r} is not one of {MODES}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStopping patience must be an integer >= 1, got {patience!r}")
        if not min_delta >= 0:
            raise ValueError(f"EarlyStopping min_delta must be >= 0, got {min_delta!r}")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.strict, self.check_on_train_epoch_end = strict, bool(check_on_train_epoch_end)
        self._warned_missing = False
        self._agree_next = False  # a training-epoch-end check happened: the next stop decision is agreed
        self.best = math.inf if mode == "min" else -math.inf
        self.best_step: int | None = None
        self.wait = 0  # validations in a row without improvement
        self.stopped_step: int | None = None

    watches_metrics = True  # after the module's on_train_epoch_end (Lightning's order)

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[{self.monitor},{self.mode}]"

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if self.check_on_train_epoch_end:  # (a training metric may be the monitor)
            return
        if not run_of(trainer).has_validation:  # it could never stop the run it was asked to watch
            raise ValueError(f"EarlyStopping(monitor={self.monitor!r}) needs validation metrics, but "
                             f"{type(module).__name__} has no val_dataset() / val_dataloader(): return one, or "
                             "remove the callback")
        if not validates_during_training(trainer):
            rank_zero_warn(log, "EarlyStopping(monitor=%r): none of trainer.val_every_n_steps, val_check_interval, "
                        "check_val_every_n_epoch is set, so validation (and this "
                        "check) runs only once, at the end of training", self.monitor)

    def on_validation_end(self, trainer: Any, module: Any, metrics: dict[str, float]) -> None:
        if trainer.sanity_checking or self.check_on_train_epoch_end:  # (the sanity pass reduces and logs nothing)
            return
        self._check(trainer, metrics, "validation")

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.check_on_train_epoch_end:
            # A step value among callback_metrics is this rank's own: the decision is agreed next.
            self._agree_next = True
            self._check(trainer, trainer.callback_metrics, "logged")

    def stop_needs_agreement(self, step: int) -> bool:
        """Once after each training-epoch-end check (every rank checked there)."""
        pending, self._agree_next = self._agree_next, False
        return pending

    def _check(self, trainer: Any, metrics: Any, what: str) -> None:
        view = run_of(trainer)
        if self.monitor not in metrics:
            message = (f"EarlyStopping(monitor={self.monitor!r}): no such {what} metric; the {what} metrics are "
                       f"{sorted(metrics)}")
            if self.strict:
                raise ValueError(message)
            if not self._warned_missing:
                self._warned_missing = True
                rank_zero_warn(log, "%s (strict=False: this check and later ones are skipped while it is missing)",
                               message)
            return
        value = float(metrics[self.monitor])
        reason = self._reason_to_stop(value, view.step)
        if reason is not None:
            self.stopped_step = view.step
            view.request_stop(reason)

    def _reason_to_stop(self, value: float, step: int) -> str | None:
        """Update the best value and the count; why training should stop now, or None."""
        if self.check_finite and not math.isfinite(value):
            return f"{self.monitor}={value} is not finite (best {self.best:.6g} at step {self.best_step})"
        if self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            return f"{self.monitor}={value:.6g} reached stopping_threshold={self.stopping_threshold}"
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            return f"{self.monitor}={value:.6g} is worse than divergence_threshold={self.divergence_threshold}"
        # An improvement beats the best by more than min_delta (in the direction of mode).
        shifted = value + self.min_delta if self.mode == "min" else value - self.min_delta
        if self._better(shifted, self.best):
            self.best, self.best_step, self.wait = value, step, 0
            return None
        self.wait += 1
        if self.wait < self.patience:
            return None
        return (f"{self.monitor} did not improve by more than {self.min_delta:g} in {self.wait} validations "
                f"(best {self.best:.6g} at step {self.best_step}, now {value:.6g})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait, "stopped_step": self.stopped_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = float(state["best"]), state["best_step"]
        self.wait, self.stopped_step = int(state["wait"]), state["stopped_step"]
