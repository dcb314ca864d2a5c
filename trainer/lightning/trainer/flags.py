"""What Lightning's ``Trainer`` says and checks about some of its arguments before a run, for the
mirror's ``Trainer`` (``trainer.py``):

- `announce_limits`: a limit of exactly one batch (``1``) or of all of them (``1.0``) is easy to
  mistake for the other; as Lightning, the Trainer says at INFO level which one it took
  (``limit_*_batches``, ``overfit_batches``, ``val_check_interval``);
- `check_val_interval`: a fractional ``val_check_interval`` with ``check_val_every_n_epoch=None``
  is Lightning's MisconfigurationException;
- `apply_barebones`: Lightning's ``Trainer(barebones=True)``: a run without checkpoints, loggers,
  progress bar, model summary or sanity-check batches. An argument that turns one of them back on is
  a ValueError naming it; the others are set off. ``self.log`` warns and logs nothing (as
  Lightning: ``trainer/api/log_methods.py``).
"""

from __future__ import annotations

from typing import Any

from trainer.api.errors import MisconfigurationException
from trainer.lightning.utilities.rank_zero import rank_zero_info
from trainer.runtime.value_checks import is_int

_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
           "overfit_batches", "val_check_interval")

#: argument -> (what barebones sets it to, whether a given value keeps the run bare)
_BAREBONES = {
    "enable_checkpointing": (False, lambda v: not v),
    "logger": (False, lambda v: v is False or v is None or v == []),
    "enable_progress_bar": (False, lambda v: not v),
    "enable_model_summary": (False, lambda v: not v),
    "num_sanity_val_steps": (0, lambda v: v == 0),
    "log_every_n_steps": (None, lambda v: v is None or v == 0),
    "fast_dev_run": (None, lambda v: not v),
    "detect_anomaly": (None, lambda v: not v),
    "profiler": (None, lambda v: v is None),
}


def check_val_interval(kwargs: dict[str, Any]) -> None:
    """As Lightning: a fractional ``val_check_interval`` is a fraction of an epoch, so it needs
    epochs to count in; with ``check_val_every_n_epoch=None`` given, it is a MisconfigurationException."""
    interval = kwargs.get("val_check_interval")
    if isinstance(interval, float) and "check_val_every_n_epoch" in kwargs and kwargs["check_val_every_n_epoch"] is None:
        raise MisconfigurationException(
            f"Trainer(val_check_interval={interval!r}, check_val_every_n_epoch=None): a fraction of an epoch needs "
            "epochs to count in; give val_check_interval as a number of training batches, or check_val_every_n_epoch=N")


def announce_limits(kwargs: dict[str, Any]) -> None:
    """One INFO line for each of `_LIMITS` given as ``1`` (one batch) or ``1.0`` (every batch)."""
    for name in _LIMITS:
        value = kwargs.get(name)
        if type(value) is int and value == 1:
            what = ("validation will run after every training batch" if name == "val_check_interval"
                    else "1 batch is used" + (" per epoch" if name == "limit_train_batches" else ""))
        elif type(value) is float and value == 1.0:
            what = ("validation will run at the end of each training epoch" if name == "val_check_interval"
                    else "100% of the batches are used" + (" per epoch" if name == "limit_train_batches" else ""))
        else:
            continue
        rank_zero_info(f"`Trainer({name}={value})` was configured so {what}.")


def apply_barebones(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without ``barebones``; with ``barebones=True``, the extras set off (see the module)."""
    if not kwargs.pop("barebones", False):
        return kwargs
    for name, (_, keeps_bare) in _BAREBONES.items():
        if name in kwargs and not keeps_bare(kwargs[name]):
            raise ValueError(f"Trainer(barebones=True) runs without checkpoints, loggers, progress bar, model "
                             f"summary, sanity-check batches, profiler or anomaly detection, but "
                             f"`Trainer({name}={kwargs[name]!r})` was passed; leave it unset or drop barebones=True")
    for name, (bare, _) in _BAREBONES.items():
        if bare is not None:
            kwargs.setdefault(name, bare)
    rank_zero_info("The Trainer is running in `Trainer(barebones=True)` mode: no checkpoints, loggers, progress "
                   "bar, model summary or sanity-check batches.")
    return kwargs


def reload_epochs(value: Any) -> int:
    """``reload_dataloaders_every_n_epochs`` checked: an int >= 0 (0: never reload)."""
    if not is_int(value) or value < 0:
        raise MisconfigurationException(
            f"reload_dataloaders_every_n_epochs={value!r}: should be an int >= 0 (epochs between two calls of the "
            "data hooks; 0: once per call)")
    return value
