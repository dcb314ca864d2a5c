"""``metrics.csv``: one row per logged step, readable by any spreadsheet or ``pandas.read_csv``."""

from __future__ import annotations

import csv
import io
import os
from typing import Any, Mapping

from trainer.loggers.base import Logger
from trainer.loggers.hparams_file import write_hparams_yaml


class CSVLogger(Logger):
    """Writes ``<run_dir>/metrics.csv`` in wide format: a ``step`` column, then one column per
    metric in the order the names first appeared; one row per step, a blank cell where a metric
    was not logged at that step.

    - Several calls for the same step (training metrics, then validation ones) fill one row: the
      last row is rewritten in place.
    - A metric name never seen before adds a column: the file is rewritten with the wider header
      into a temporary file that then replaces it (``os.replace``), so a reader or a crash sees
      either the old file or the new one, never half a header. New names are rare (the first
      logging step, the first validation), so the rewrites are too.
    - Every row is flushed as it is written. An existing file (a resumed run in the same run
      directory) is appended to, keeping its columns.

    Args:
        run_dir: the directory the file goes to.
        filename: the file's name in ``run_dir``.
        log_dir: the directory for the file instead of ``run_dir`` (null: ``run_dir``; a DeepSpeed config's
            ``csv_monitor.output_path/job_name``).
    """

    def __init__(self, run_dir: str, filename: str = "metrics.csv", log_dir: str | None = None):
        run_dir = log_dir or run_dir
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, filename)
        self._columns: list[str] = ["step"]
        self._has_header = False
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, newline="", encoding="utf-8") as f:
                header = next(csv.reader(f), None)
            if header:
                self._columns, self._has_header = header, True
        self._file = open(self.path, "ab")
        self._last_row: dict[str, Any] | None = None  # the row this logger wrote last
        self._last_row_offset = 0  # where that row starts in the file

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row: dict[str, Any] = {"step": step, **metrics}
        same_step = self._last_row is not None and self._last_row["step"] == step
        if same_step:
            row = {**self._last_row, **row}
        new_columns = [name for name in row if name not in self._columns]
        if new_columns or not self._has_header:
            self._columns.extend(new_columns)
            self._rewrite(row, replace_last_row=same_step)
        else:
            if same_step:
                self._file.truncate(self._last_row_offset)
            self._last_row_offset = os.fstat(self._file.fileno()).st_size
            self._file.write(self._encode([row]))
            self._file.flush()
        self._last_row = row

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Write ``params`` to ``hparams.yaml`` beside the metrics (secrets redacted)."""
        write_hparams_yaml(os.path.dirname(self.path), params)

    def finalize(self) -> None:
        self._file.close()

    def _encode(self, rows: list[Mapping[str, Any]], header: bool = False) -> bytes:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self._columns, restval="", lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue().encode("utf-8")

    def _rewrite(self, row: Mapping[str, Any], replace_last_row: bool) -> None:
        """Write the file anew with the current columns: its old rows, then ``row``."""
        self._file.close()
        with open(self.path, newline="", encoding="utf-8") as f:
            old_rows = list(csv.DictReader(f)) if self._has_header else []
        if replace_last_row:
            old_rows = old_rows[:-1]
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(self._encode(old_rows, header=True))
            self._last_row_offset = f.tell()
            f.write(self._encode([row]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        self._has_header = True
        self._file = open(self.path, "ab")
