"""Config errors as a user of ``python train.py`` sees them: one line, no traceback.

A bad value in the config (``data.batch_size=-4``, ``trainer.devices=0``,
``strategy.sharding=bogus``) is found while the Trainer, strategy and module are built from the
config, and raised there as a ``ValueError`` / ``TypeError`` whose message names the key, the value
and what is allowed. The traceback of our own code that Hydra would print around it says nothing
more; `config_errors` prints ``error: <message>`` on rank 0 instead (the other ranks stay
quiet) and the run exits with status 1. ``HYDRA_FULL_ERROR=1`` keeps Hydra's full report.
Errors raised later, while training (a bug in a user's ``training_step``), are not touched: they
keep their traceback; only a ``CheckpointError`` from ``fit`` (a damaged or unfitting checkpoint named
by ``trainer.resume``: the message names the file) is reported the same way (`checkpoint_errors`).

In a multirun (``-m``) the failed job is reported the same way and the sweep goes on with the
next job; the process exits with status 1 at the end (`exit_status`). A job that a launcher plugin
(submitit) runs in a process of its own reports the line in its log and fails with it as a
`SettingError`, which the submitting command prints in one line (the Optuna sweeper counts the trial
as failed and goes on).

Errors Hydra raises itself while it composes the config (a mistyped key, group option or override)
are reported the same way, in one line with the valid names (`hydra_errors_in_one_line`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Iterator

from trainer.cli.hydra_errors import describe
from trainer.runtime import distributed
from trainer.runtime.redact import redact_secrets

_failed_jobs = 0
# A file or directory named in the config that is not there (data.path, data.tokens, ...): said while
# the job is built, before anything is trained.
_MISSING_FILE = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


class JobCannotStart(RuntimeError):
    """Some rank could not build the job (the message names the ranks and their errors)."""


class SettingError(ValueError):
    """A sweeper's or launcher's setting that cannot work (the message names the key), raised before any
    job starts; also a config error of a job a launcher plugin ran in a process of its own, handed back to
    the submitting command. Reported in one line like a config error (`hydra_errors_in_one_line`)."""


def _config_error(error: BaseException) -> BaseException | None:
    """The error to report in one line, or None if ``error`` is not a config error."""
    from trainer.checkpoint.manager import CheckpointError

    if isinstance(error, (ValueError, TypeError, JobCannotStart, CheckpointError, *_MISSING_FILE)):
        return error
    try:  # hydra.utils.instantiate wraps what the target's __init__ raised
        from hydra.errors import InstantiationException
    except ImportError:  # pragma: no cover
        return None
    cause = error.__cause__ if isinstance(error, InstantiationException) else None
    return cause if isinstance(cause, (ValueError, TypeError, *_MISSING_FILE)) else None


def one_line(error: BaseException | str) -> str:
    """``error: <message>`` on one line, secrets redacted (a bad value read from ``$HF_TOKEN``)."""
    return "error: " + redact_secrets(" ".join(str(error).split()))


def _checkpoint_error(error: BaseException) -> BaseException | None:
    from trainer.checkpoint.manager import CheckpointError

    return error if isinstance(error, CheckpointError) else None


@contextlib.contextmanager
def config_errors(multirun: bool = False, only_checkpoint: bool = False) -> Iterator[None]:
    """Report a config error raised inside as one line and end the job (see the module docstring).
    ``only_checkpoint``: around ``fit``, where only a ``CheckpointError`` is one."""
    global _failed_jobs
    try:
        yield
    except Exception as error:
        reported = (_checkpoint_error if only_checkpoint else _config_error)(error)
        if reported is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if distributed.rank() == 0:
            print(one_line(reported), file=sys.stderr, flush=True)
        if not multirun:
            raise SystemExit(1) from None
        if os.environ.get("SUBMITIT_EXECUTOR"):
            # A launcher plugin's job, in a process (or on a machine) of its own: the line above went to the
            # job's log; the command that submitted it learns of the failure from the job's result.
            raise SettingError(" ".join(str(reported).split())) from None
        _failed_jobs += 1


def exit_status() -> int:
    """1 if a multirun job failed with a config error (each was printed when it happened)."""
    return 1 if _failed_jobs else 0


@contextlib.contextmanager
def hydra_errors_in_one_line() -> Iterator[None]:
    """Around a ``@hydra.main`` function: an error Hydra raises while composing the config is
    printed as ``error: <one line>`` (see `trainer.cli.hydra_errors`) and the process exits with
    status 1. Hydra reports every other error as it would; ``HYDRA_FULL_ERROR=1`` keeps its report
    for all of them."""
    try:
        import hydra._internal.utils as hydra_utils
    except ImportError:  # pragma: no cover
        hydra_utils = None
    # Hydra reports its errors through this one function (around composing and around the job).
    original = getattr(hydra_utils, "run_and_report", None)
    if original is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return

    def run_and_report(func):
        try:
            return func()
        except Exception as error:
            try:
                message = _setting_error(error) or describe(error)
            except Exception:  # describing failed: Hydra's own report is better than none
                message = None
            if message is None:  # Hydra reports it, as it would have
                return original(functools.partial(_raise, error))
            if distributed.rank() == 0:
                print(one_line(message), file=sys.stderr, flush=True)
            sys.exit(1)

    hydra_utils.run_and_report = run_and_report
    try:
        yield
    finally:
        hydra_utils.run_and_report = original


def _setting_error(error: BaseException) -> str | None:
    """The message of a `SettingError`, also when Hydra wrapped it (instantiating a sweeper)."""
    for candidate in (error, error.__cause__):
        if isinstance(candidate, SettingError):
            return str(candidate)
    return None


def _raise(error: BaseException) -> None:
    raise error
