"""Lightning's ``lightning.pytorch.cli``: ``LightningCLI`` (``cli_run.py``), ``LightningArgumentParser``,
``ReduceLROnPlateau``, ``instantiate_class`` and the type aliases (``cli_parser.py``),
``SaveConfigCallback`` (``cli_save_config.py``), built on jsonargparse as Lightning's are, and
``cli_lightning_logo``.

jsonargparse is an optional dependency (``pip install 'meshtrainer[cli]'``): it is imported when one
of these names is first used, so ``cli_lightning_logo`` works without it, and a missing jsonargparse
is an ImportError that says what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.lightning._missing import missing_names


def cli_lightning_logo() -> None:
    """Lightning prints its logo here; this trainer prints nothing (a program that calls it runs as is)."""


#: each name and the module that defines it (imported on first use: they need jsonargparse)
_LAZY = {
    "LightningCLI": "trainer.lightning.cli_run",
    "SaveConfigCallback": "trainer.lightning.cli_save_config",
    **{name: "trainer.lightning.cli_parser" for name in (
        "LightningArgumentParser", "ReduceLROnPlateau", "instantiate_class", "ArgsType", "OptimizerCallable",
        "LRSchedulerCallable", "LRSchedulerType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion")},
}

_missing = missing_names(__name__, {
    "instantiate_module": "LightningCLI's parsed model (cli.model) or instantiate_class(args, "
                          "{'class_path': ..., 'init_args': ...})",
})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        return _missing(name)
    try:
        module = importlib.import_module(_LAZY[name])
    except ModuleNotFoundError as error:
        if error.name != "jsonargparse" and not (error.name or "").startswith("jsonargparse."):
            raise
        raise ImportError(f"trainer.lightning.cli.{name} is built on jsonargparse, which is not installed; "
                          "pip install 'meshtrainer[cli]' (jsonargparse[signatures]>=4.27)") from error
    value = getattr(module, name)
    globals()[name] = value
    return value


__all__ = ["cli_lightning_logo", *_LAZY]
