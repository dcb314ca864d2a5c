"""``metrics.csv``: one row per logged step, readable by any spreadsheet or ``pandas.read_csv``."""

from __future__ import annotations

import csv
import io
import os
from typing import Any, Mapping

from trainer.loggers.base import DummyExperiment, Logger, writes_here
from trainer.loggers.hparams_file import write_hparams_yaml
from trainer.loggers.remote_files import RemoteCSV, is_remote
from trainer.loggers.versions import AppendedFile, VersionedDir, VersionedFolders, replace_existing_log_dir


class CSVLogger(VersionedFolders, AppendedFile, Logger):
    """Writes ``metrics.csv`` in wide format: a ``step`` column, then one column per
    metric in the order the names first appeared; one row per step, a blank cell where a metric
    was not logged at that step.

    - Several calls for the same step (training metrics, then validation ones) fill one row: the
      last row is rewritten in place.
    - A metric name never seen before adds a column: the file is rewritten with the wider header
      into a temporary file that then replaces it (``os.replace``), so a reader or a crash sees
      either the old file or the new one, never half a header. New names are rare (the first
      logging step, the first validation), so the rewrites are too.
    - Every row is flushed as it is written. An existing file (a resumed run in the same run
      directory) is appended to, keeping its columns; as Lightning's, a ``version`` given by hand
      whose folder already holds files gives a warning and its old ``metrics.csv`` is replaced.

    Built as Lightning's: ``CSVLogger(save_dir, name="lightning_logs", version=None)`` writes
    ``<save_dir>/<name>/version_<n>/metrics.csv`` (``log_dir``; the next free version unless given).
    Built by name (``loggers=["csv"]``, ``conf/logger/``): into the run directory itself (``in_run_dir``).
    Nothing is written before the first row. ``experiment`` is the logger itself (rank 0).
    A ``save_dir`` URL (``memory://``, ``s3://`` ... through fsspec, as Lightning's) keeps the rows and
    writes the whole file at each ``save()`` and at ``finalize`` (a remote file is not rewritten in place).

    Args:
        save_dir: the folder the logger's folders go into (see above).
        name: the folder under ``save_dir`` (None or "": none).
        version: the ``version_<n>`` folder under ``name`` (an int n, or a string used as the folder's
            name; None: the next free version).
        prefix: put before every metric name, joined with "-".
        flush_logs_every_n_steps: Lightning's: ``save()`` is called every this many steps (every row
            is on disk as it is written; ``experiment.metrics`` holds the rows since the last save).
        filename: the file's name in ``log_dir``.
    """

    def __init__(self, save_dir: Any, name: str | None = "lightning_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100, filename: str = "metrics.csv"):
        if not isinstance(flush_logs_every_n_steps, int) or flush_logs_every_n_steps < 1:
            raise ValueError(f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps!r}) must be an integer >= 1")
        self._dirs = VersionedDir(save_dir, name, version)
        self._prefix = prefix
        self._filename = filename
        self._file: Any = None  # opened at the first row
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        #: the rows logged since the last ``save()`` (Lightning's experiment writer's buffer; here every
        #: row is on disk already)
        self.metrics: list[dict[str, Any]] = []
        # a version given by hand whose folder holds files: Lightning's warning, and its metrics file replaced
        self._check_existing = version is not None
        self._remote = is_remote(save_dir)

    @classmethod
    def in_run_dir(cls, run_dir: str, filename: str = "metrics.csv", log_dir: str | None = None) -> CSVLogger:
        """The logger ``loggers=["csv"]`` builds: ``filename`` in ``log_dir`` (a DeepSpeed config's
        ``csv_monitor.output_path/job_name``), else in the run directory."""
        logger = cls(log_dir or run_dir, name="", version="", filename=filename)
        logger._check_existing = False  # the run directory's file: a resumed run appends to it
        return logger


    @property
    def path(self) -> str:
        """The CSV file."""
        return os.path.join(self.log_dir, self._filename)

    metrics_file_path = path  # Lightning's experiment writer's name

    @property
    def experiment(self) -> Any:
        """This logger (Lightning's CSV experiment writer: ``log_metrics``, ``log_hparams``,
        ``save``, ``metrics``) on rank 0; a DummyExperiment elsewhere. The first use checks a
        version folder given by hand (see ``log_metrics``)."""
        if not writes_here():
            return DummyExperiment()
        if self._check_existing and not self._remote:
            self._check_existing = False
            replace_existing_log_dir(self.log_dir, self.path)
        return self

    def _open(self) -> None:
        if self._remote:  # (a version given by hand starts a new file, as a local one's is replaced)
            rows, self._check_existing = ([] if self._check_existing else self._read_rows()), False
            self._file = RemoteCSV(self.path, rows)
            self._columns, self._has_header = self._file.columns, True
            self._last_row = self._file.rows[-1] if self._file.rows else None
            return
        if self._check_existing:
            self._check_existing = False
            replace_existing_log_dir(self.log_dir, self.path)
        os.makedirs(self.log_dir, exist_ok=True)
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

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not writes_here():
            return
        if self._file is None:
            self._open()
        if step is None:  # (Lightning's writer: the row after the last one)
            step = self._last_row["step"] + 1 if self._last_row is not None else 0
        values = {(f"{self._prefix}-{k}" if self._prefix else k): (v.item() if hasattr(v, "item") else v)
                  for k, v in metrics.items()}
        row: dict[str, Any] = {"step": step, **values}
        same_step = self._last_row is not None and self._last_row["step"] == step
        if same_step:
            row = {**self._last_row, **row}
        new_columns = [name for name in row if name not in self._columns]
        if self._remote:
            self._file.add(row, replace_last_row=same_step)
        elif new_columns or not self._has_header:
            self._columns.extend(new_columns)
            self._rewrite(row, replace_last_row=same_step)
        else:
            if same_step:
                self._file.truncate(self._last_row_offset)
            self._last_row_offset = os.fstat(self._file.fileno()).st_size
            self._file.write(self._encode([row]))
            self._file.flush()
        self._last_row = row
        self.metrics.append(row)
        if (step + 1) % self.flush_logs_every_n_steps == 0:
            self.save()

    def save(self) -> None:
        """Lightning's periodic save (every ``flush_logs_every_n_steps`` steps): the rows are on disk
        already (a URL's file: written now); the buffer of rows since the last save is emptied."""
        if self._remote and self._file is not None:
            self._file.write()
        self.metrics = []

    def rows_up_to(self, step: int) -> list[tuple[int, dict[str, float]]]:
        """The file's rows with a step up to ``step`` as ``[(step, {name: value})]`` (names without
        the prefix; blank cells left out)."""
        strip = len(self._prefix) + 1 if self._prefix else 0
        return [(row_step, {name[strip:]: float(value) for name, value in row.items() if name != "step" and value != ""})
                for row_step, row in self._read_rows() if row_step <= step]

    def resume_at(self, step: int, history: list | None, dropped_from: int | None) -> None:
        """A resume from the checkpoint at ``step``: rows after it are dropped (the file rewritten
        atomically); values logged at ``step`` itself after the save are taken back to the
        ``history``'s (the calls made before the save). The next call at ``step`` fills that row."""
        if not writes_here():
            return
        self._check_existing = False  # the file holds the run being resumed
        self.finalize()
        rows = self._read_rows()
        if not rows:
            return
        self._open()  # the columns of the file's header
        if self._remote:
            self._file.rows = [row for row_step, row in rows if row_step <= step]
            self._file.write()
            self._last_row = self._file.rows[-1] if self._file.rows else None
            return
        kept = [(row_step, row) for row_step, row in rows if row_step <= step]
        if kept and kept[-1][0] == step and dropped_from is not None and dropped_from <= step and history is not None:
            before_save: dict[str, Any] = {}
            for call_step, values in history:
                if call_step == step:
                    before_save.update({(f"{self._prefix}-{k}" if self._prefix else k): v for k, v in values.items()})
            kept[-1] = (step, {"step": step, **before_save})
        self._file.close()
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(self._encode([row for _, row in kept[:-1]], header=True))
            self._last_row_offset = f.tell()
            f.write(self._encode([row for _, row in kept[-1:]]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        self._file = open(self.path, "ab")
        self._last_row = {**kept[-1][1], "step": kept[-1][0]} if kept else None

    def _read_rows(self) -> list[tuple[int, dict[str, Any]]]:
        """(step, row) of every complete row of the file (a row cut short by a kill is left out)."""
        if self._remote:
            text = RemoteCSV.read_text(self.path)
        elif not os.path.exists(self.path):
            return []
        else:
            with open(self.path, newline="", encoding="utf-8") as f:
                text = f.read()
        if not text.endswith("\n"):
            text = text[:text.rfind("\n") + 1]
        rows = []
        for row in csv.DictReader(io.StringIO(text)):
            try:
                rows.append((int(row["step"]), row))
            except (KeyError, TypeError, ValueError):
                continue
        return rows

    def log_hyperparams(self, params: Mapping[str, Any] | None = None) -> None:
        """Write ``params`` to ``hparams.yaml`` beside the metrics (secrets redacted); no ``params``
        (as Lightning's): an empty file, the version folder made."""
        if writes_here() and self._remote:
            RemoteCSV.write_hparams(self.log_dir, params or {})
        elif writes_here():
            os.makedirs(self.log_dir, exist_ok=True)
            write_hparams_yaml(self.log_dir, params or {})

    log_hparams = log_hyperparams  # Lightning's experiment writer's name


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
