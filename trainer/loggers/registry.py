"""Logger names -> backends, and the one place the accepted forms of ``Trainer(loggers=...)`` are
checked and built."""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping, Union

from trainer.loggers.base import Logger
from trainer.loggers.csv_logger import CSVLogger
from trainer.loggers.jsonl_logger import JSONLLogger
from trainer.loggers.mlflow_logger import MLFlowLogger
from trainer.loggers.tensorboard_logger import TensorBoardLogger
from trainer.loggers.wandb_logger import WandbLogger

#: name -> backend; ``conf/logger/<name>.yaml`` holds each one's options.
LOGGERS: dict[str, type[Logger]] = {
    "jsonl": JSONLLogger,
    "tensorboard": TensorBoardLogger,
    "csv": CSVLogger,
    "wandb": WandbLogger,
    "mlflow": MLFlowLogger,
}

#: What ``Trainer()`` writes with when no logger is chosen (and with Lightning's ``logger=True``).
#: TensorBoard first: ``trainer.logger`` (a module's ``self.logger``) is then a TensorBoard logger, as
#: Lightning's default, so ``self.logger.experiment.add_image(...)`` writes.
DEFAULT_LOGGERS = ("tensorboard", "jsonl")

#: A checked logger choice: a Logger instance as given, or (name, options) built on rank 0.
LoggerSpec = Union[Logger, "tuple[str, dict[str, Any]]"]


def resolve_logger_specs(loggers: Any) -> list[LoggerSpec]:
    """Check ``loggers`` and return it as a list of `LoggerSpec`, without building anything.

    Accepted: None (no loggers); a name (``"csv"``); a Logger instance; a mapping ``{name: options}``
    (what ``conf/logger/`` composes to: ``{"csv": {"filename": "m.csv"}, "jsonl": {}}``); or a list
    of any of these. Raises ValueError naming an unknown logger (and listing the known ones), an
    option a backend does not take, a bad option value, or a name selected twice.
    """
    if loggers is None:
        return []
    if isinstance(loggers, (str, Logger, Mapping)):
        loggers = [loggers]
    specs: list[LoggerSpec] = []
    for item in _as_list(loggers):
        if isinstance(item, Logger):
            specs.append(item)
        elif isinstance(item, str):
            specs.append(_checked(item, None))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):  # already checked
            specs.append(_checked(*item))
        elif isinstance(item, Mapping):
            specs.extend(_checked(name, options) for name, options in item.items())
        else:
            raise TypeError(f"a logger is a name, a {{name: options}} mapping or a Logger instance, got {item!r}")
    names = [spec[0] for spec in specs if isinstance(spec, tuple)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"logger(s) {twice} selected more than once")
    return specs


def choose_loggers(logger: Any, loggers: Any, loggers_given: bool) -> Any:
    """The ``loggers=`` value for Lightning's ``Trainer(logger=...)``: True (the default loggers),
    False (none), a Logger or a list of them; None: not given, ``loggers`` as it is. Giving both is
    an error."""
    if logger is None:
        return loggers
    if loggers_given:
        raise TypeError(f"Trainer(logger={logger!r}, loggers={loggers!r}): give one of them (logger= is Lightning's "
                        "name: True, False, a Logger or a list of them; loggers= also takes names)")
    if logger is True:
        return DEFAULT_LOGGERS
    if logger is False:
        return []
    items = [logger] if isinstance(logger, Logger) else logger
    if not isinstance(items, Iterable) or isinstance(items, (str, Mapping)) or not all(isinstance(i, Logger) for i in items):
        raise TypeError(f"Trainer(logger={logger!r}): give True, False, a Logger (TensorBoardLogger(save_dir), "
                        "CSVLogger(save_dir), WandbLogger(...)) or a list of them; names go to loggers=")
    return list(items)


def build_loggers(loggers: Any, run_dir: str) -> list[Logger]:
    """The Logger objects for ``loggers`` (any form `resolve_logger_specs` accepts); a
    backend chosen by name is built as ``Backend.in_run_dir(run_dir, **options)`` (or
    ``Backend(run_dir, **options)``). Building writes nothing: files open at the first write."""
    specs = resolve_logger_specs(loggers)
    return [spec if isinstance(spec, Logger) else _builder(LOGGERS[spec[0]])(run_dir, **spec[1]) for spec in specs]


def settle_versions(loggers: Any) -> None:
    """Fix the version folder of every Logger instance given (the next free ``version_<n>``) before
    worker processes copy them, so that the caller's objects name the folder the run writes."""
    for spec in resolve_logger_specs(loggers):
        if isinstance(spec, Logger):
            _ = spec.version


def _builder(backend: type[Logger]) -> Any:
    return getattr(backend, "in_run_dir", backend)


def _as_list(loggers: Any) -> list:
    if not isinstance(loggers, Iterable):
        raise TypeError(f"loggers must be a name, a mapping, a Logger or a list of them, got {loggers!r}")
    return list(loggers)


def _checked(name: Any, options: Any) -> tuple[str, dict[str, Any]]:
    if name not in LOGGERS:
        raise ValueError(f"unknown logger {name!r}; available: {', '.join(sorted(LOGGERS))}")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"the options of logger {name!r} must be a mapping, got {options!r}")
    options = dict(options)
    backend = LOGGERS[name]
    accepted = list(inspect.signature(_builder(backend)).parameters)[1:]  # after run_dir
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"logger {name!r} has no option(s) {unknown}; its options: {', '.join(accepted)}")
    check = getattr(backend, "check_options", None)
    if check is not None:
        check(**options)
    return name, options


def agree_versions(loggers: list[Logger]) -> None:
    """Rank 0's version folder for every logger that picks one (Lightning's ``version_<n>``), on every
    rank: ranks that chose on their own may have seen another rank's new folder. A collective when
    any logger has a version folder (every rank holds the same kinds of loggers)."""
    from trainer.runtime import distributed

    versioned = [logger for logger in loggers if isinstance(logger, (TensorBoardLogger, CSVLogger))]
    if not versioned or not distributed.is_distributed():
        return
    versions = distributed.broadcast_object([logger.version if distributed.rank() == 0 else None for logger in versioned])
    for logger, version in zip(versioned, versions):
        logger.version = version
