"""The strategy registry is the Hydra config group ``strategy/``: ``<name>.yaml`` whose ``_target_``
names the class. The command line composes it (``strategy=ddp``); the Python API
(``Trainer(strategy="ddp")``) resolves a name through the same yaml, so adding a strategy is one
Python file plus one yaml, and helper modules may live beside the strategies they serve.

Where the yamls are looked for: the built-in ``strategy/`` group (``builtin_config_dir``: the
installed package's configs, in a checkout its ``conf/``), then every directory given to `add_config_dir`,
laid out as ``conf/`` is (``<dir>/strategy/<name>.yaml``), the same directory one would pass to
``hydra.searchpath`` on the command line. A later directory's yaml wins over an earlier one of the
same name, as on Hydra's search path.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from trainer.runtime.config_dir import builtin_config_dir

GROUP = "strategy"
_extra_dirs: list[str] = []


def add_config_dir(path: str) -> None:
    """Also look for ``<path>/strategy/<name>.yaml`` (a directory laid out as ``conf/``, as given
    to ``hydra.searchpath``). Raises ValueError if it has no ``strategy/`` folder."""
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.join(path, GROUP)):
        raise ValueError(f"add_config_dir({path!r}): no {GROUP}/ folder there to hold <name>.yaml files")
    if path not in _extra_dirs:
        _extra_dirs.append(path)


def _yamls() -> dict[str, str]:
    """Strategy name -> its yaml's path (later directories win)."""
    found: dict[str, str] = {}
    for root in [str(builtin_config_dir()), *_extra_dirs]:
        folder = os.path.join(root, GROUP)
        if os.path.isdir(folder):
            for entry in sorted(os.listdir(folder)):
                if entry.endswith(".yaml"):
                    found[entry[: -len(".yaml")]] = os.path.join(folder, entry)
    return found


def available_strategies() -> list[str]:
    """The strategy names a config or ``Trainer(strategy=...)`` may use, sorted."""
    return sorted(_yamls())


def _read(path: str) -> dict[str, Any]:
    """A strategy yaml as a plain dict, interpolations (``${...}``) kept as written. The package's
    own yamls (plain keys and scalars, read alike either way: tests/unit/strategies/test_registry.py)
    are read with PyYAML, which the trainer imports anyway: importing OmegaConf costs a tenth of a
    second at every start, paid only for the yamls of ``add_config_dir``'s directories."""
    if os.path.dirname(os.path.dirname(os.path.abspath(path))) == os.path.abspath(builtin_config_dir()):
        import yaml

        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)  # type: ignore[return-value]


def strategy_class(name: str) -> type:
    """The class ``<name>.yaml``'s ``_target_`` names. ValueError for an unknown name (listing the
    available ones) or a yaml without a ``_target_``."""
    yamls = _yamls()
    if name not in yamls:
        where = "" if yamls else f" (no {GROUP}/*.yaml found under {builtin_config_dir()} or add_config_dir's directories)"
        raise ValueError(f"unknown strategy {name!r}; available: {', '.join(sorted(yamls))}{where}")
    target = _read(yamls[name]).get("_target_")
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"{yamls[name]}: _target_={target!r} must name the strategy class as 'module.Class'")
    module_name, _, class_name = target.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def yaml_values(name: str) -> dict[str, Any]:
    """The settings ``<name>.yaml`` gives besides ``_target_``, except interpolations (such as
    ``${trainer.accelerator}``), which only the command line's composed config can resolve."""
    raw = _read(_yamls()[name])
    return {key: value for key, value in raw.items()
            if key != "_target_" and not (isinstance(value, str) and "${" in value)}


def resolve_strategy(strategy: Any, **options: Any) -> Any:
    """A Strategy instance from a name (``"ddp"``) or an instance (returned as is). A name is built
    with its yaml's values (as the command line would) under ``options``, which win; the class's
    defaults stand for the rest."""
    from trainer.strategies.base import Strategy

    if isinstance(strategy, Strategy):
        return strategy
    cls = strategy_class(strategy)  # checks the name first
    return cls(**{**yaml_values(strategy), **options})
