"""Where the built-in Hydra configs are: the package ``trainer.conf`` (``config.yaml`` and its groups).

The build maps the repository's top-level ``conf/`` (the source) to ``trainer/conf``: a wheel holds
the yaml files there, and an editable install's finder answers ``trainer.conf`` with ``conf/``
itself. Asking the import system rather than joining a path to ``trainer/`` finds both, so the
command line, the Python API (``Trainer(strategy="ddp")``) and the tools read one directory.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

#: the package that holds the built-in configs
CONFIG_PACKAGE = "trainer.conf"


def builtin_config_dir() -> Path:
    """The directory holding ``config.yaml`` and the config groups (``strategy/``, ``recipe/``, ...).

    Raises FileNotFoundError naming the package, or the path, when the package was installed
    without its configs.
    """
    try:
        path = Path(str(importlib.resources.files(CONFIG_PACKAGE)))
    except ModuleNotFoundError as error:
        raise FileNotFoundError(f"the trainer's built-in configs are missing: no package {CONFIG_PACKAGE} "
                                f"(reinstall the package: pip install meshtrainer, or pip install -e . "
                                f"in a checkout)") from error
    if not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"the trainer's built-in configs are missing: no config.yaml in {path} "
                                f"(reinstall the package)")
    return path
