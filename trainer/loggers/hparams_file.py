"""``<run_dir>/hparams.yaml``: the hyperparameters the file-based loggers (csv, jsonl) record, as
Lightning's CSVLogger writes them, but readable: objects as their text (``trainer/api/hparams_display.py``;
a module's layer tree as a block of lines), never Python tags; secrets redacted."""

from __future__ import annotations

import os
from typing import Any, Mapping

import yaml

from trainer.api.hparams_display import readable
from trainer.runtime.redact import redact_secrets

FILENAME = "hparams.yaml"


def _plain(value: Any) -> Any:
    """YAML-safe: mappings, lists and scalars as they are; an object as its readable text."""
    return readable(plain_keys(value))


def plain_keys(value: Any) -> Any:
    """``value`` with every mapping key that is not a str, int, float, bool or None (``5j``, a tuple)
    as its text, nested mappings included: what JSON and YAML files can hold as a key."""
    if isinstance(value, Mapping):
        return {(key if key is None or isinstance(key, (str, int, float, bool)) else str(key)): plain_keys(item)
                for key, item in value.items()}
    return value


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a module's layer tree) as YAML blocks, one line each."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text and not any(line != line.rstrip() for line in text.split("\n")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def hparams_yaml_text(params: Mapping[str, Any]) -> str:
    """``params`` (redacted) as the text of ``hparams.yaml``."""
    return yaml.dump(redact_secrets(_plain(dict(params))), Dumper=_Dumper, sort_keys=False)


def write_hparams_yaml(run_dir: str, params: Mapping[str, Any]) -> str:
    """Write ``params`` (redacted) to ``<run_dir>/hparams.yaml`` atomically; returns its path."""
    path = os.path.join(run_dir, FILENAME)
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(hparams_yaml_text(params))
    os.replace(path + ".tmp", path)
    return path
