"""Lightning's progress-bar callbacks: ``ProgressBar`` (the base a custom bar subclasses) and
``TQDMProgressBar``. ``trainer.progress_bar_callback`` is one of them (the Trainer's own choice:
``trainer/lightning/trainer/progress.py``).

What a bar reads is Lightning's: ``total_train_batches``, ``total_val_batches`` (0 in an epoch that
does not validate), the current loader's ``total_*_batches_current_dataloader``, and
``get_metrics(trainer, module)`` (``v_num``, the loggers' version, and
``trainer.progress_bar_metrics``). The tqdm bar drawn on rank 0 is the trainer's own
(trainer/observe/progress.py), shown while the ``TQDMProgressBar`` is enabled; a custom
``ProgressBar`` subclass draws itself from its hooks, and the trainer's bar stays off. Of
``TQDMProgressBar``'s settings, ``refresh_rate=0`` turns the bar off (as Lightning); the others change
how the bar is drawn, never what is trained, and are said to be ignored."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from trainer.api.callback import Callback
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


class ProgressBar(Callback):
    """Lightning's base class of progress bars: the counts a bar shows and ``get_metrics``; a subclass
    draws (its hooks) and implements ``enable`` / ``disable``."""

    def __init__(self) -> None:
        self._trainer: Any = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self) -> Any:
        """The Trainer this bar belongs to (a TypeError before one took it, as Lightning's)."""
        if self.__dict__.get("_trainer") is None:
            raise TypeError(f"{type(self).__name__}.trainer: no Trainer has taken this progress bar yet")
        return self._trainer

    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    @property
    def total_train_batches(self) -> int | float:
        """Training batches of the current epoch (inf for a stream); without an epoch limit, at most the
        steps left before ``max_steps``."""
        trainer = self.trainer
        batches = trainer.num_training_batches
        if trainer.max_epochs in (None, -1) and trainer.max_steps not in (None, -1) and trainer.max_steps > 0:
            return min(batches, trainer.max_steps - trainer.global_step)
        return batches

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches over every loader of the current epoch's validation; 0 in an epoch that
        does not validate (``check_val_every_n_epoch``, no validation data, ``limit_val_batches=0``)."""
        trainer = self.trainer
        every = getattr(trainer, "check_val_every_n_epoch", None)
        if not trainer.enable_validation or (every is not None and (trainer.current_epoch + 1) % every):
            return 0
        return sum(trainer.num_val_batches)

    def _current(self, batches: list[int]) -> int | float:
        index = self._current_eval_dataloader_idx
        return batches[index if index is not None else 0] if batches else 0

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation loader running now (of the sanity check's, during it)."""
        return self._current(self.trainer.num_val_batches)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        """Batches of the test loader running now."""
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        """Batches of the predict loader running now."""
        return self._current(self.trainer.num_predict_batches)

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Note ``dataloader_idx`` as the loader running now; whether it differs from the last one noted."""
        old, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return old != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        self._current_eval_dataloader_idx = None

    def disable(self) -> None:
        """Turn the bar off (a subclass says how)."""
        raise NotImplementedError(f"{type(self).__name__}.disable(): a progress bar subclass implements it")

    def enable(self) -> None:
        """Turn the bar on (a subclass says how)."""
        raise NotImplementedError(f"{type(self).__name__}.enable(): a progress bar subclass implements it")

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: Any, module: Any) -> dict[str, Any]:
        """What the bar shows: ``v_num`` (the loggers' version; a string's last 4 characters) and
        ``trainer.progress_bar_metrics``. Override it to change the items (call ``super()`` first)."""
        standard = _version_item(trainer)
        shown = trainer.progress_bar_metrics
        both = sorted(standard.keys() & shown.keys())
        if both:
            warnings.warn(f"self.log({both[0]!r}, ..., prog_bar=True) replaces the progress bar's own {both[0]!r} "
                          "(the loggers' version); give the value another name or override get_metrics()",
                          stacklevel=2)
        return {**standard, **shown}


def _version_item(trainer: Any) -> dict[str, Any]:
    loggers = list(trainer.loggers)
    if not loggers:
        return {}
    if len(loggers) == 1:
        version = loggers[0].version
    else:
        version = "_".join(dict.fromkeys(str(logger.version) for logger in loggers))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}


class TQDMProgressBar(ProgressBar):
    """Lightning's tqdm bar: while it is enabled on rank 0 the trainer's own bar is drawn (see the module)."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__()
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ValueError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}): give an int >= 0 (0: no bar)")
        ignored = {name: value for name, value, default in (
            ("refresh_rate", refresh_rate, 1), ("process_position", process_position, 0), ("leave", leave, False))
            if value != default and not (name == "refresh_rate" and value == 0)}
        if ignored:
            settings = ", ".join(f"{name}={value!r}" for name, value in ignored.items())
            rank_zero_warn(log, "TQDMProgressBar(%s) is ignored: the trainer draws its own bar on rank 0 "
                           "(Trainer(progress_bar=True / False))", settings)
        self._refresh_rate, self._process_position, self._leave = refresh_rate, process_position, leave
        self._enabled = True

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    def process_position(self) -> int:
        return self._process_position

    @property
    def leave(self) -> bool:
        return self._leave

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self._refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def disable(self) -> None:
        """No bar from the next call of the Trainer on."""
        self._enabled = False

    def enable(self) -> None:
        """The bar again from the next call of the Trainer on (where ``refresh_rate`` > 0)."""
        self._enabled = True
