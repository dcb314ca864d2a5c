"""``metrics.jsonl``: a contract other tools (and the tests) rely on."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

from trainer.loggers.base import Logger, writes_here
from trainer.loggers.hparams_file import write_hparams_yaml
from trainer.loggers.versions import AppendedFile


class JSONLLogger(AppendedFile, Logger):
    """Appends ``{"step": ..., **metrics}`` to ``<run_dir>/metrics.jsonl``, one JSON object per
    call, flushed every line so a crash loses nothing that was logged. Non-finite numbers are
    written as ``null`` (JSON has no NaN). The file opens at the first line."""

    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        self.save_dir = self.log_dir = run_dir
        self.path = os.path.join(run_dir, filename)
        self._file: Any = None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if not writes_here():
            return
        if self._file is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        record = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` to ``hparams.yaml`` beside the metrics (secrets redacted)."""
        if writes_here():
            os.makedirs(self.log_dir, exist_ok=True)
            write_hparams_yaml(os.path.dirname(self.path), params)

