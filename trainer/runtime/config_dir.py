"""Where the built-in Hydra configs are: ``conf/`` inside the installed ``trainer`` package.

In the repository ``trainer/conf`` is a link to the top-level ``conf/`` (the source); a built wheel
holds the yaml files themselves at ``trainer/conf``. Either way the same path answers, so the
command line, the Python API (``Trainer(strategy="ddp")``) and the tools read one directory.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def builtin_config_dir() -> Path:
    """The directory holding ``config.yaml`` and the config groups (``strategy/``, ``recipe/``, ...).

    Raises FileNotFoundError naming the path when the package was installed without its configs.
    """
    path = _PACKAGE / "conf"
    if not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"the trainer's built-in configs are missing: no config.yaml in {path} "
                                f"(reinstall the package; in a checkout trainer/conf links to conf/)")
    return path
