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
        self._lines: int | None = None  # lines in the file, counted when first asked for

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if not writes_here():
            return
        if self._file is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        record = {"step": step, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._lines is not None:
            self._lines += 1

    def lines_written(self) -> int:
        """The lines in the file now (a checkpoint records it: a resume from it keeps that many)."""
        if self._lines is None:
            from trainer.loggers.resume_history import read_jsonl

            self._lines = len(read_jsonl(self.path))
        return self._lines

    def cut_to_checkpoint(self, step: int, logged_rows: int | None) -> tuple[list, int | None]:
        """A resume from the checkpoint at ``step``: keep the first ``logged_rows`` lines (the calls
        made before it was saved; None: the lines up to ``step``), drop the rest atomically, and
        return (the kept calls as ``[(step, values)]``, the smallest step among the dropped ones)."""
        from trainer.loggers.resume_history import read_jsonl, write_jsonl_atomically

        self.finalize()  # reopened (appending) at the next line
        rows = read_jsonl(self.path)
        if logged_rows is not None and logged_rows > len(rows):  # not this file's count (another run directory's)
            logged_rows = None
        if logged_rows is None:
            kept = [row for row in rows if row.get("step", 0) <= step]
            dropped = [row for row in rows if row.get("step", 0) > step]
        else:
            kept, dropped = rows[:logged_rows], rows[logged_rows:]
        if os.path.exists(self.path):
            write_jsonl_atomically(self.path, kept)
        self._lines = len(kept)
        history = [(row["step"], {k: v for k, v in row.items() if k != "step"}) for row in kept if "step" in row]
        return history, min((row.get("step", step) for row in dropped), default=None)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` to ``hparams.yaml`` beside the metrics (secrets redacted)."""
        if writes_here():
            os.makedirs(self.log_dir, exist_ok=True)
            write_hparams_yaml(os.path.dirname(self.path), params)

