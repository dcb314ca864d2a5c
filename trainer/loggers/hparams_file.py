"""``<run_dir>/hparams.yaml``: the hyperparameters the file-based loggers (csv, jsonl) record, as
Lightning's CSVLogger writes them; secrets redacted."""

from __future__ import annotations

import os
from typing import Any, Mapping

from trainer.runtime.redact import redact_secrets

FILENAME = "hparams.yaml"


def _plain(value: Any) -> Any:
    """YAML-safe: mappings, lists and scalars as they are; anything else as its ``str``."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_hparams_yaml(run_dir: str, params: Mapping[str, Any]) -> str:
    """Write ``params`` (redacted) to ``<run_dir>/hparams.yaml`` atomically; returns its path."""
    import yaml

    path = os.path.join(run_dir, FILENAME)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        yaml.safe_dump(_plain(redact_secrets(dict(params))), handle, sort_keys=False)
    os.replace(path + ".tmp", path)
    return path
