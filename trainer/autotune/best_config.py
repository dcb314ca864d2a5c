"""The best candidate as a config file that ``trainer --config-path DIR --config-name NAME`` runs as is.

The file is a primary config whose defaults list composes train.py's own ``config`` (found through
``hydra.searchpath``, this checkout's conf/) with the group choices of the overrides
(``override /recipe: mlp``, ``override /strategy: fsdp``), and whose own values (``_self_``, last)
are the value overrides (``trainer.devices: 2``, ``data.batch_size: 16`` ...). So it composes to
what ``python train.py <the same overrides>`` composes to; `check_same_config` verifies that
with Hydra before the file is announced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.autotune.settings import CONF_DIR, AutotuneError

TRAIN_CONFIG = "config"  # train.py's primary config (conf/config.yaml)


def _is_group(key: str, conf_dir: Path) -> bool:
    """Whether ``key`` names a config group: of the built-in configs, or of the project's ``conf/``
    that the ``trainer`` command searches first in the folder it runs in."""
    from trainer.cli.project_dir import project_conf_dir

    project = project_conf_dir()
    return "." not in key and ((conf_dir / key).is_dir() or (project is not None and (project / key).is_dir()))


def config_document(overrides: list[str], conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """The config file's content for ``overrides`` (as typed for train.py; later ones win)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    groups: dict[str, tuple[bool, Any]] = {}  # group -> (added with +, choice)
    values = OmegaConf.create({})
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key, value = override.key_or_group, override.value()
        if override.is_sweep_override() or override.is_delete() or override.package is not None:
            raise AutotuneError(f"{override.input_line!r} cannot be written into a config file")
        if _is_group(key, conf_dir):
            groups[key] = (override.is_add(), value)
        else:
            OmegaConf.update(values, key, value, merge=False, force_add=True)
    defaults: list[Any] = [TRAIN_CONFIG]
    defaults += [{(f"/{group}" if added else f"override /{group}"): choice} for group, (added, choice) in groups.items()]
    defaults.append("_self_")  # last: the values win over the recipe's, as on the command line
    document = {"defaults": defaults, "hydra": {"searchpath": [f"file://{conf_dir}"]}}
    document.update(OmegaConf.to_container(values, resolve=False))
    return document


def write_best_config(path: Path, overrides: list[str], comment: str, conf_dir: Path = CONF_DIR) -> str:
    """Write the config file for ``overrides`` to ``path`` (``<dir>/<name>.yaml``), check that Hydra
    composes it to the same config as the overrides, and return the command that runs it."""
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(OmegaConf.create(config_document(overrides, conf_dir)))
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + text, encoding="utf-8")
    check_same_config(path, overrides, conf_dir)
    return run_command(path)


def run_command(path: Path) -> str:
    """``python -m trainer --config-path DIR --config-name NAME`` for the file at ``path`` (the
    ``trainer`` command; ``python train.py`` in a checkout takes the same arguments)."""
    import shlex

    return f"python -m trainer --config-path {shlex.quote(str(path.parent.resolve()))} --config-name {path.stem}"


def compose_file(path: Path, overrides: list[str] | None = None) -> Any:
    """The config Hydra composes from the file at ``path`` (what train.py would run)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base="1.3"):
        return compose(path.stem, overrides=overrides or [])


def check_same_config(path: Path, overrides: list[str], conf_dir: Path = CONF_DIR) -> None:
    """An ``AutotuneError`` unless the file composes to the config ``overrides`` compose to."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        expected = OmegaConf.to_container(compose(TRAIN_CONFIG, overrides=overrides), resolve=False)
    written = OmegaConf.to_container(compose_file(path), resolve=False)
    if written != expected:
        differ = sorted(k for k in set(written) | set(expected) if written.get(k) != expected.get(k))
        raise AutotuneError(f"{path} composes to another config than its overrides (top-level keys {differ}); "
                            f"run train.py with these overrides instead: {' '.join(overrides)}")
