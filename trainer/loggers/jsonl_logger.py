"""``metrics.jsonl``: a contract other tools (and the tests) rely on."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

from trainer.loggers.base import Logger
from trainer.loggers.hparams_file import write_hparams_yaml


class JSONLLogger(Logger):
    """Appends ``{"step": ..., **metrics}`` to ``<run_dir>/metrics.jsonl``, one JSON object per
    call, flushed every line so a crash loses nothing that was logged. Non-finite numbers are
    written as ``null`` (JSON has no NaN)."""

    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, filename)
        self._file = open(self.path, "a", encoding="utf-8")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        record = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` to ``hparams.yaml`` beside the metrics (secrets redacted)."""
        write_hparams_yaml(os.path.dirname(self.path), params)

    def finalize(self) -> None:
        self._file.close()
