"""Putting a DeepSpeed JSON's settings into the composed config, with this precedence:
the JSON's values replace the composed ones (config defaults and the recipe); only overrides typed on
the command line win over the JSON."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable

from trainer.deepspeed_config.mapping import Mapped, map_json
from trainer.deepspeed_config.reading import read_json
from trainer.runtime.config_dir import builtin_config_dir
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


def typed_keys(overrides: Iterable[str]) -> list[str]:
    """The config paths that command-line overrides set: ``optimizer.lr=0.1`` -> ``optimizer.lr``,
    ``strategy=fsdp`` (a group) -> ``strategy``, ``+x=1`` / ``++x=1`` / ``~x`` -> ``x``."""
    keys = []
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        keys.append("precision" if key == "trainer.precision" else key)  # the same setting (cli.merge_precision)
    return keys


def _covered(path: str, typed: list[str]) -> bool:
    return any(path == key or path.startswith(key + ".") for key in typed)


def world_size_of(cfg: Any) -> tuple[int, str]:
    """``trainer.devices x trainer.num_nodes`` (numbers needed: the batch keys depend on them)."""
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    for name, value in (("devices", devices), ("num_nodes", nodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"trainer.{name}={value!r}: with a deepspeed_config give a number >= 1 (its batch "
                             "sizes depend on the world size)")
    return devices * nodes, f"trainer.devices x trainer.num_nodes = {devices} x {nodes}"


def apply_deepspeed_config(cfg: Any, overrides: Iterable[str], start_dir: str = ".") -> None:
    """``train.py``'s hook: apply ``cfg.deepspeed_config`` (a path, relative to ``start_dir``: the
    directory the run starts in, also under ``hydra.job.chdir=true``) if given, under the command
    line's ``overrides``."""
    path = cfg.get("deepspeed_config")
    if path is not None:
        apply_json(cfg, os.path.join(start_dir, str(path)), [str(o) for o in overrides], start_dir)


def apply_json(cfg: Any, path: str, overrides: Iterable[str] = (), start_dir: str = ".") -> Mapped:
    """Set what the DeepSpeed config at ``path`` means into ``cfg`` (an OmegaConf config, changed in
    place) except where ``overrides`` (Hydra's task overrides, as typed) set the same key. Returns the
    mapping. Logs one warning listing the keys that only tune speed and are not used. ``start_dir``:
    what the JSON's relative monitor paths are relative to."""
    from omegaconf import open_dict

    world, world_from = world_size_of(cfg)
    mapped = map_json(read_json(path), world, world_from, start_dir)
    typed = typed_keys(overrides)
    skipped: list[str] = []
    with open_dict(cfg):
        for key, value in mapped.leaves.items():
            _set(cfg, key, value, typed, skipped)
        for key, node in mapped.nodes.items():
            _replace(cfg, key, node, typed, skipped)
            if key == "precision" and not _covered("precision", typed):
                cfg.trainer.precision = None  # a recipe's trainer.precision gives way to the JSON too
        _apply_strategy(cfg, *mapped.strategy, typed, skipped)
        _apply_loggers(cfg, mapped.loggers, typed, skipped)
    if mapped.speed_only:
        rank_zero_warn(log, "deepspeed_config: keys that only tune DeepSpeed's speed or memory, not used here: %s",
                       ", ".join(mapped.speed_only))
    if skipped:
        log.info("deepspeed_config: the command line wins over the JSON for %s", ", ".join(skipped))
    return mapped


def _set(cfg: Any, key: str, value: Any, typed: list[str], skipped: list[str]) -> None:
    from omegaconf import OmegaConf

    if _covered(key, typed):
        skipped.append(key)
    else:
        OmegaConf.update(cfg, key, value, merge=False)


def _replace(cfg: Any, key: str, node: dict[str, Any], typed: list[str], skipped: list[str]) -> None:
    """Replace the node at ``key`` by ``node``, keeping the values typed for keys under it."""
    from omegaconf import OmegaConf

    if _covered(key, typed):
        skipped.append(key)
        return
    kept = {k: OmegaConf.select(cfg, k) for k in typed if k.startswith(key + ".")}
    OmegaConf.update(cfg, key, node, merge=False)
    for name, value in kept.items():
        OmegaConf.update(cfg, name, value, merge=False)
        skipped.append(name)


def _yaml_node(group: str, name: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(os.path.join(builtin_config_dir(), group, f"{name}.yaml")), resolve=False)
    return node.get(name, {}) if group == "logger" else node


def _apply_strategy(cfg: Any, name: str, settings: dict[str, Any], typed: list[str], skipped: list[str]) -> None:
    """The strategy the ZeRO stage means; the composed node's other settings stay when it already is that
    strategy (a recipe's fsdp wrap policy, say), else the strategy's yaml gives them."""
    node = _yaml_node("strategy", name)
    current = cfg.get("strategy")
    if current is not None and current.get("_target_") == node["_target_"]:
        for key, value in settings.items():
            _set(cfg, f"strategy.{key}", value, typed, skipped)
    else:
        _replace(cfg, "strategy", {**node, **settings}, typed, skipped)


def _apply_loggers(cfg: Any, loggers: dict[str, Any], typed: list[str], skipped: list[str]) -> None:
    """TensorBoard / CSV / W&B present exactly when the JSON enables them (jsonl and others stay)."""
    if _covered("logger", typed):
        skipped.append("logger")
        return
    if cfg.get("logger") is None:
        cfg.logger = {}
    for name, options in loggers.items():
        if _covered(f"logger.{name}", typed):
            skipped.append(f"logger.{name}")
        elif options is None:
            cfg.logger.pop(name, None)
        elif name in cfg.logger:
            for key, value in options.items():
                _set(cfg, f"logger.{name}.{key}", value, typed, skipped)
        else:
            _replace(cfg, f"logger.{name}", {**_yaml_node("logger", name), **options}, typed, skipped)
