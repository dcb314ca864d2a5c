"""The loggers of Lightning's ``Trainer`` (a mixin of the mirror's ``Trainer``, ``trainer.py``):

- the default logger list is Lightning's: ``TensorBoardLogger(save_dir=default_root_dir,
  name="lightning_logs")`` when TensorBoard is installed, else a ``CSVLogger`` with the same folders
  (``logger=True`` or not given); ``default_root_dir`` not given is the working directory, as
  Lightning's;
- ``trainer.log_dir`` is Lightning's: the first logger's ``log_dir`` (a TensorBoard or CSV logger) or
  ``save_dir`` (another logger), else ``default_root_dir``;
- the trainer's own ``metrics.jsonl`` (every logged row, what this trainer's tools read) is written
  into ``trainer.log_dir`` beside the loggers' files but is not one of ``trainer.loggers`` (a module's
  ``for logger in self.loggers: logger.experiment...`` sees Lightning's list); with no logger
  (``logger=False``, ``fast_dev_run``) nothing is written, as under Lightning, and neither is
  ``train.log`` or ``flops.txt``, which otherwise go into ``trainer.log_dir`` too;
- ``PL_TRAINER_<ARGUMENT>`` environment variables give the arguments not passed (Lightning's
  ``PL_TRAINER_MAX_STEPS=7``): the value read as a Python literal, else as text.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import warnings
from typing import Any, Iterable

from trainer.loggers import CSVLogger, JSONLLogger, TensorBoardLogger
from trainer.loggers.remote_files import is_remote

ENV_PREFIX = "PL_TRAINER_"


def lightning_default_loggers(save_dir: str) -> list[Any]:
    """Lightning's default logger for ``save_dir``: TensorBoard when installed, else CSV."""
    if importlib.util.find_spec("tensorboard") is not None:
        return [TensorBoardLogger(save_dir=save_dir, name="lightning_logs", version=os.environ.get("SLURM_JOB_ID"))]
    return [CSVLogger(save_dir=save_dir, name="lightning_logs")]


def with_lightning_logging(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with Lightning's ``default_root_dir`` (the working directory) when neither it nor
    ``run_dir`` is given, and Lightning's default logger list for ``logger`` True or not given (unless
    this trainer's ``loggers=`` is)."""
    merged = dict(kwargs)
    if merged.get("run_dir") is None and merged.get("default_root_dir") is None:
        merged["default_root_dir"] = os.getcwd()
    if "loggers" not in merged and merged.get("logger", True) in (None, True):
        merged["logger"] = lightning_default_loggers(os.fspath(merged.get("default_root_dir") or merged["run_dir"]))
    return merged


def with_environment_arguments(kwargs: dict[str, Any], accepted: Iterable[str]) -> dict[str, Any]:
    """``kwargs`` with each ``PL_TRAINER_<NAME>`` environment variable of an ``accepted`` argument
    not given (a given argument wins); a warning names a ``PL_TRAINER_`` variable that is none."""
    accepted = set(accepted)
    merged = dict(kwargs)
    for variable, text in os.environ.items():
        if not variable.startswith(ENV_PREFIX) or text == "":
            continue
        name = variable[len(ENV_PREFIX):].lower()
        if name not in accepted:
            warnings.warn(f"environment variable {variable}={text!r} is not a Trainer argument and is ignored; "
                          f"the arguments: {', '.join(sorted(accepted))}", UserWarning, stacklevel=3)
            continue
        if name in merged:
            continue
        try:
            merged[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            merged[name] = text
    return merged


def trainer_arguments(trainer_class: type) -> list[str]:
    """The keyword arguments ``trainer_class`` and its bases accept (the ``PL_TRAINER_`` names)."""
    names: list[str] = []
    for cls in trainer_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and parameter.name != "self":
                names.append(parameter.name)
    return names


class _TrainerRecord(JSONLLogger):
    """``metrics.jsonl`` kept beside Lightning's loggers: the rows only (the loggers write hparams.yaml)."""

    def log_hyperparams(self, params: Any) -> None:
        pass


class LightningLoggers:
    """``log_dir``, the trainer's own record and ``train.log`` as Lightning's Trainer places them."""

    run_dir: str
    loggers: list

    @property
    def log_dir(self) -> str | None:
        """Lightning's ``trainer.log_dir``: the first logger's ``log_dir`` (TensorBoard, CSV) or
        ``save_dir`` (another logger); without loggers ``default_root_dir``. The same on every rank
        during a run (rank 0's version folder)."""
        loggers = self.loggers
        if not loggers:
            return self.run_dir
        first = loggers[0]
        directory = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
        return os.fspath(directory) if directory is not None else None

    def record_loggers(self, loggers: list[Any], run_dir: str) -> list[Any]:
        """``metrics.jsonl`` in ``trainer.log_dir`` when there is a logger with a folder (see the module);
        none when the loggers given hold this trainer's own record already (``loggers=["jsonl"]``)."""
        if any(isinstance(logger, JSONLLogger) for logger in loggers):
            return []
        directory = self.log_dir if loggers else None
        return [_TrainerRecord(directory)] if directory is not None and not is_remote(directory) else []

    def log_files_dir(self, run_dir: str) -> str | None:
        """``train.log`` and ``flops.txt`` beside the loggers' files (``trainer.log_dir``); no logger, or
        a logger writing to a URL: none."""
        directory = self.log_dir if self.loggers else None
        return directory if directory is not None and not is_remote(directory) else None
