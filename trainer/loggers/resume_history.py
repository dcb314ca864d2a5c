"""Dashboards after a resume: each holds every logged step once, with its value.

A job killed after its last checkpoint leaves its dashboards in three states at once: the files
written line by line (``metrics.jsonl``, ``metrics.csv``) hold rows past the checkpoint that the
resumed run logs again; TensorBoard and W&B buffer their writes, so they may lack steps before the
checkpoint (a W&B offline file can hold nothing but its header) and hold some after it.

On resume, rank 0 calls `resume_loggers` with the checkpoint's step and the number of
``log_metrics`` calls the run had made when it was saved (``logged_rows``):

- ``metrics.jsonl`` (one line per call, flushed as written: the durable history) is cut back to its
  first ``logged_rows`` lines, atomically (a temporary file that replaces it);
- every other logger with a ``resume_at(step, history, dropped_from)`` method then drops what the
  killed run logged after the checkpoint, as its format allows, and fills from ``history`` what it
  lacks up to the checkpoint's step.

``history`` is the cut ``metrics.jsonl`` read as ``[(step, {name: value})]``, one entry per call.
Without a jsonl logger in the run it is the CSV logger's rows; with neither it is None (a logger
can then drop, not fill).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable

log = logging.getLogger(__name__)

def resume_loggers(loggers: Iterable[Any], step: int, logged_rows: int | None, checkpoint_run_dir: str | None = None) -> None:
    """Bring ``loggers`` back to the checkpoint at ``step`` (rank 0, after the checkpoint loaded).
    ``logged_rows``: the lines metrics.jsonl had when it was saved (None for a checkpoint that lacks
    the count: the rows up to ``step`` are kept then). ``checkpoint_run_dir``: the run directory the
    checkpoint belongs to, when it is not the loggers' (a job resumed into a new run directory): the
    files there are left as they are; the new directory's files keep nothing after ``step``, and the
    W&B and MLflow runs (the dashboards both directories share) are filled from the checkpoint's run's metrics.jsonl."""
    from trainer.loggers.csv_logger import CSVLogger
    from trainer.loggers.jsonl_logger import JSONLLogger
    from trainer.loggers.mlflow_logger import MLFlowLogger
    from trainer.loggers.wandb_logger import WandbLogger

    loggers = list(loggers)
    history: list | None = None
    dropped_from: int | None = None  # the smallest step among the rows logged after the save
    jsonl = next((logger for logger in loggers if isinstance(logger, JSONLLogger)), None)
    earlier_history = None
    if checkpoint_run_dir is not None:
        if jsonl is not None:
            earlier = JSONLLogger(checkpoint_run_dir, os.path.basename(jsonl.path))
            earlier_history = kept_calls(read_jsonl(earlier.path), step, logged_rows)
        logged_rows = None  # a count of the other directory's file
    if jsonl is not None:
        history, dropped_from = jsonl.cut_to_checkpoint(step, logged_rows)
    else:
        csv_logger = next((logger for logger in loggers if isinstance(logger, CSVLogger)), None)
        if csv_logger is not None:
            history = csv_logger.rows_up_to(step)
    if history is None and any(hasattr(logger, "resume_at") for logger in loggers if not isinstance(logger, CSVLogger)):
        log.warning("resumed at step %d without a jsonl or csv logger: TensorBoard and W&B may lack steps before it "
                    "that they had not written out when the run stopped (add the jsonl logger to fill them)", step)
    for logger in loggers:
        if checkpoint_run_dir is not None and isinstance(logger, (WandbLogger, MLFlowLogger)):
            logger.resume_at(step, earlier_history, None, earlier_run_dir=checkpoint_run_dir)
        elif logger is not jsonl and hasattr(logger, "resume_at"):
            logger.resume_at(step, history, dropped_from)


def kept_calls(rows: list[dict[str, Any]], step: int, logged_rows: int | None) -> list[tuple[int, dict[str, Any]]]:
    """The calls of metrics.jsonl's ``rows`` made before the checkpoint at ``step`` was saved: the
    first ``logged_rows`` (when the file has that many), else those up to ``step``."""
    kept = rows[:logged_rows] if logged_rows is not None and logged_rows <= len(rows) else \
        [row for row in rows if row.get("step", 0) <= step]
    return [(row["step"], {k: v for k, v in row.items() if k != "step"}) for row in kept if "step" in row]


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The complete lines of a ``metrics.jsonl`` (a line cut short by a kill is left out, also one
    that a later run appended to)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # the last line of a killed write
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def write_jsonl_atomically(path: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` as the whole of ``path``: a temporary file, synced, then renamed over it, so a reader
    or another kill sees the old file or the new one."""
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def merged_by_step(history: list, after: int, through: int) -> list[tuple[int, dict[str, Any]]]:
    """The calls of ``history`` with ``after < step <= through``, merged into one row per step (a
    later call's value wins), in step order. JSON's null (a non-finite value) reads as NaN."""
    rows: dict[int, dict[str, Any]] = {}
    for step, values in history:
        if after < step <= through:
            row = rows.setdefault(step, {})
            row.update({name: float("nan") if value is None else value for name, value in values.items()})
    return sorted(rows.items())
