"""Lightning's run-length arguments, checked and resolved: ``fast_dev_run``, ``limit_train_batches``,
``limit_val_batches``, ``limit_test_batches``, ``limit_predict_batches``, ``overfit_batches``,
``min_epochs`` / ``min_steps``, ``val_check_interval``, ``check_val_every_n_epoch``,
``num_sanity_val_steps`` and ``default_root_dir``.

Units (world-size independent):

- ``limit_train_batches``: an int counts optimizer steps (global batches) per epoch; a float in
  (0, 1] is that fraction of the epoch's steps (rounded down, at least 1); 0 (or 0.0): ``fit``
  trains nothing (as Lightning: the sanity pass, ``on_fit_start`` / ``on_fit_end``, no step, no
  validation, no checkpoint).
- ``limit_val_batches`` / ``num_sanity_val_steps``: an int counts global validation batches (the
  validation batch size x the data-parallel ranks), i.e. the first ``n x val batch size x ranks``
  samples of the validation order, spread over the ranks: the same samples for the same global
  batch on any world size; a float in (0, 1] is that fraction of the loader's batches of its batch
  size (rounded down, at least 1, as Lightning's on one process); ``limit_val_batches=0`` (or 0.0): no validation at all, no sanity pass either.
- ``limit_test_batches`` / ``limit_predict_batches``: an int counts the first global evaluation
  batches (dataset-order batches of the loader's batch size, the same on any world size,
  ``trainer/loop/evaluation.py``); a float is that fraction of them (rounded down, as Lightning);
  0: the pass is skipped (``test`` returns ``{}``, ``predict`` None, no hook runs).
- ``overfit_batches``: Lightning's: ``limit_train_batches`` and ``limit_val_batches`` both set to it
  (winning over them) and both sets read in dataset order during ``fit`` (no shuffling or sampler,
  with Lightning's warning when a loader asked for one); 0: off.
- ``min_epochs`` / ``min_steps``: a stop asked for (EarlyStopping, ``trainer.should_stop``) waits
  until ``min_epochs`` epochs finished and ``global_step`` reached ``min_steps`` (as Lightning,
  which logs that training continues); ``max_steps`` / ``max_epochs`` still end the run. Unset
  ``max_epochs`` (with ``max_steps=-1``) becomes ``min_epochs`` when that is larger than 1.
- ``val_check_interval``: an int is ``val_every_n_steps`` (optimizer steps; both given and
  different: an error); a float in (0, 1] is that fraction of an epoch's steps (rounded down, at least 1).
- ``check_val_every_n_epoch``: also validate at the end of every N epochs (None: not at epoch ends).
- ``num_sanity_val_steps``: validation batches run before the first step, so that a broken
  ``validation_step`` fails at once (-1: all, 0: none; Lightning's default 2). Nothing is logged,
  no hook runs, and the training stream is unchanged (``trainer/loop/sanity_check.py``).
- ``fast_dev_run``: True or n: n optimizer steps of one epoch and n validation batches, no sanity
  pass, no checkpoints, no loggers (as Lightning); False / 0: off.
- ``default_root_dir``: Lightning's name for ``run_dir`` (logs; ``checkpoints/`` unless
  ``checkpoint.dir`` is set); both given and different: an error. Not under ``train.py``, where the
  run directory is Hydra's (``hydra.run.dir=...``).
"""

from __future__ import annotations

import logging
from typing import Any

from trainer.api.errors import MisconfigurationException
from trainer.runtime.value_checks import is_int


log = logging.getLogger(__name__)


def require(condition: bool, message: str) -> None:
    """Lightning's error for a run-length argument (a ``MisconfigurationException``, so a ValueError too)."""
    if not condition:
        raise MisconfigurationException(message)


def _is_fraction(value: Any) -> bool:
    return isinstance(value, float) and 0.0 < value <= 1.0


def check_limit(name: str, value: Any, unit: str) -> Any:
    """``None``, an int >= 0 or a float in [0, 1] (returned as given; a whole float above 1, such as
    ``1e50``, is that many batches, as Lightning reads it); else an error naming the value and what is allowed."""
    if isinstance(value, float) and value > 1 and value.is_integer():
        return int(value)
    require(value is None or (is_int(value) and value >= 0) or _is_fraction(value) or value == 0.0,
             f"trainer.{name}={value!r}: passed invalid value; give an integer >= 0 ({unit}; 0: none), a float in [0, 1] (a fraction) or "
             "null (no limit)")
    return value


def check_min_run(min_epochs: Any, min_steps: Any) -> None:
    """``min_epochs`` / ``min_steps``: None or an int >= 0."""
    for name, value in (("min_epochs", min_epochs), ("min_steps", min_steps)):
        require(value is None or (is_int(value) and value >= 0),
                f"trainer.{name}={value!r}: give an integer >= 0 or null (a stop may come at any step)")


def overfit_limit(value: Any) -> Any:
    """``overfit_batches`` checked: 0 / 0.0 (off) -> None, else the limit it puts on both passes."""
    require((is_int(value) and value >= 0) or _is_fraction(value) or value == 0.0,
            f"trainer.overfit_batches={value!r}: passed invalid value; give an integer >= 0 (global batches; 0: off) or a float in [0, 1]")
    return value or None


def disables(limit: Any) -> bool:
    """Whether a ``limit_*_batches`` value turns its pass off (0 or 0.0)."""
    return limit is not None and not isinstance(limit, bool) and limit == 0


def fast_dev_run_steps(value: Any) -> int:
    """``fast_dev_run`` as a number of steps: True -> 1, False / 0 -> 0 (off), an int n >= 0 -> n."""
    if isinstance(value, bool):
        return int(value)
    require(is_int(value) and value >= 0, f"trainer.fast_dev_run={value!r}: should be >= 0; give true, false or an integer >= 0")
    return value


def check_sanity_steps(value: Any) -> None:
    require(is_int(value) and value >= -1,
             f"trainer.num_sanity_val_steps={value!r}: give an integer >= 0 (validation batches before training; "
             "0: none) or -1 (the whole validation set)")


def check_epoch_interval(value: Any) -> None:
    require(value is None or (is_int(value) and value >= 1),
             f"trainer.check_val_every_n_epoch={value!r}: give an integer >= 1 or null (no validation at epoch ends)")


def merge_val_interval(val_every_n_steps: int | None, val_check_interval: Any) -> tuple[int | None, float | None]:
    """``(val_every_n_steps, fraction)``: an int ``val_check_interval`` is ``val_every_n_steps`` (giving
    both, different, is an error); a float is kept as a fraction of the epoch, resolved at fit."""
    if val_check_interval is None:
        return val_every_n_steps, None
    require((is_int(val_check_interval) and val_check_interval >= 1) or _is_fraction(val_check_interval),
             f"trainer.val_check_interval={val_check_interval!r}: passed invalid value; give an integer >= 1 (optimizer steps, as "
             "val_every_n_steps), a float in (0, 1] (a fraction of an epoch) or null")
    if is_int(val_check_interval):
        require(val_every_n_steps in (None, val_check_interval),
                 f"trainer.val_check_interval={val_check_interval} and trainer.val_every_n_steps={val_every_n_steps} "
                 "mean the same (validate every N optimizer steps) but differ: give one")
        return val_check_interval, None
    require(val_every_n_steps is None,
             f"trainer.val_check_interval={val_check_interval} (a fraction of an epoch) and "
             f"trainer.val_every_n_steps={val_every_n_steps} both set when to validate: give one")
    return None, val_check_interval


def resolve_run_dir(run_dir: str | None, default_root_dir: str | None) -> str | None:
    """``default_root_dir`` is Lightning's name for our run directory (logs and, unless
    ``checkpoint.dir`` is set, ``checkpoints/``); giving both, different, is an error."""
    require(default_root_dir is None or isinstance(default_root_dir, (str, bytes)) or hasattr(default_root_dir, "__fspath__"),
             f"trainer.default_root_dir={default_root_dir!r}: give a directory path or null")
    if default_root_dir is None:
        return run_dir
    default_root_dir = str(default_root_dir)
    require(run_dir in (None, default_root_dir),
             f"trainer.default_root_dir={default_root_dir!r} and run_dir={run_dir!r} name the same directory "
             "(where logs and checkpoints go) but differ: give one")
    return default_root_dir


def fraction_of(limit: Any, total: int) -> int:
    """A limit as a count out of ``total``: an int as is (at most ``total``), a float as that fraction
    of ``total`` (rounded down, at least 1), None: ``total``."""
    if limit is None:
        return total
    if limit == 0:
        return 0
    if isinstance(limit, float):
        return max(1, int(limit * total)) if total else 0
    return min(limit, total)


def train_steps_per_epoch(trainer: Any, steps_per_epoch: int) -> int:
    """Optimizer steps per epoch under ``trainer.limit_train_batches``."""
    return fraction_of(trainer.limit_train_batches, steps_per_epoch)


def val_sample_limit(limit: Any, val_batch_size: int, ranks: int, num_samples: int) -> int | None:
    """Validation samples under ``limit`` (global batches of ``val_batch_size x ranks``, or a fraction
    of the loader's batches of ``val_batch_size``, rounded down as Lightning's on one process, at least
    one); None: all."""
    if limit is None or limit == -1 or (isinstance(limit, float) and limit == 1.0):
        return None
    if isinstance(limit, float):
        return min(fraction_of(limit, -(-num_samples // val_batch_size)) * val_batch_size, num_samples)
    return min(limit * val_batch_size * ranks, num_samples)


def eval_sample_limit(limit: Any, batch_size: int, num_samples: int) -> int:
    """The samples a test / predict pass runs under ``limit``: the first ``n`` dataset-order batches
    of ``batch_size`` (a float: that fraction of the batches, rounded down as Lightning's)."""
    if limit is None:
        return num_samples
    batches = -(-num_samples // batch_size)
    kept = int(limit * batches) if isinstance(limit, float) else min(limit, batches)
    return min(kept * batch_size, num_samples)


def val_interval_steps(trainer: Any, steps_per_epoch: int) -> int | None:
    """``val_every_n_steps`` once the epoch length is known (a float ``val_check_interval``)."""
    if trainer.val_check_fraction is None:
        return trainer.val_every_n_steps
    return fraction_of(trainer.val_check_fraction, steps_per_epoch) or None
