"""Metric sinks, written by rank 0 only. ``metrics.jsonl`` is a contract other tools rely on:
one JSON object per line with at least ``step`` (optimizer steps done) and the logged values.

Backends are imported only when used (TensorBoard costs ~0.2 s to import, W&B ~0.45 s).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping


class Logger:
    """Interface: three methods, like Lightning Fabric's."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's configuration (default: ignore)."""

    def finalize(self) -> None:
        """Flush and close (default: nothing to do)."""


class JSONLLogger(Logger):
    """Appends ``{"step": ..., **metrics}`` to ``<run_dir>/metrics.jsonl``, flushed every line so a
    crash loses nothing that was logged."""

    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, filename)
        self._file = open(self.path, "a", encoding="utf-8")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        record = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def finalize(self) -> None:
        self._file.close()


class TensorBoardLogger(Logger):
    """Event files in the run directory (``tensorboard --logdir <run_dir>``)."""

    def __init__(self, run_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=run_dir)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self._writer.add_text("config", "```\n" + json.dumps(params, indent=2, default=str) + "\n```")

    def finalize(self) -> None:
        self._writer.close()


LOGGERS = {"jsonl": JSONLLogger, "tensorboard": TensorBoardLogger}


def build_loggers(names: list[str], run_dir: str) -> list[Logger]:
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"unknown logger(s) {unknown}; available: {sorted(LOGGERS)}")
    return [LOGGERS[name](run_dir) for name in names]
