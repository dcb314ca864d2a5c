"""Logger names -> backends, and the one place the accepted forms of ``Trainer(loggers=...)`` are
checked and built."""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping, Union

from trainer.loggers.base import Logger
from trainer.loggers.csv_logger import CSVLogger
from trainer.loggers.jsonl_logger import JSONLLogger
from trainer.loggers.tensorboard_logger import TensorBoardLogger
from trainer.loggers.wandb_logger import WandbLogger

#: name -> backend; ``conf/logger/<name>.yaml`` holds each one's options.
LOGGERS: dict[str, type[Logger]] = {
    "jsonl": JSONLLogger,
    "tensorboard": TensorBoardLogger,
    "csv": CSVLogger,
    "wandb": WandbLogger,
}

#: A checked logger choice: a Logger instance as given, or (name, options) built on rank 0.
LoggerSpec = Union[Logger, "tuple[str, dict[str, Any]]"]


def resolve_logger_specs(loggers: Any) -> list[LoggerSpec]:
    """Check ``loggers`` and return it as a list of :data:`LoggerSpec`, without building anything.

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


def build_loggers(loggers: Any, run_dir: str) -> list[Logger]:
    """The Logger objects for ``loggers`` (any form :func:`resolve_logger_specs` accepts); a
    backend chosen by name is built as ``Backend(run_dir, **options)``. Called on rank 0 only."""
    specs = resolve_logger_specs(loggers)
    return [spec if isinstance(spec, Logger) else LOGGERS[spec[0]](run_dir, **spec[1]) for spec in specs]


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
    accepted = list(inspect.signature(backend).parameters)[1:]  # after run_dir
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"logger {name!r} has no option(s) {unknown}; its options: {', '.join(accepted)}")
    check = getattr(backend, "check_options", None)
    if check is not None:
        check(**options)
    return name, options
