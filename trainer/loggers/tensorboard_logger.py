"""TensorBoard event files (``tensorboard --logdir <dir>``)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from trainer.loggers.background_writer import BackgroundWriter, python_number
from trainer.loggers.base import DummyExperiment, Logger, writes_here
from trainer.loggers.hparams_file import plain_keys, write_hparams_yaml
from trainer.loggers.tensorboard_graph import add_graph, graph_input
from trainer.loggers.versions import VersionedDir, VersionedFolders
from trainer.runtime.redact import redact_secrets

#: ``torch.utils.tensorboard.SummaryWriter`` options a TensorBoardLogger passes on (Lightning's ``**kwargs``).
WRITER_OPTIONS = ("comment", "purge_step", "filename_suffix")


class TensorBoardLogger(VersionedFolders, Logger):
    """Scalars in event files; the config as a text summary named ``config`` and in the HPARAMS tab
    (secrets redacted). TensorBoard is imported and the event file opened at the first write, on a
    thread of the logger's own (trainer/loggers/background_writer.py): a logging step only queues
    its numbers. ``experiment``, ``save()`` and ``finalize()`` first wait for what is queued.

    Built as Lightning's: ``TensorBoardLogger(save_dir, name="lightning_logs", version=None)`` writes
    into ``<save_dir>/<name>/version_<n>`` (``log_dir``; the next free version unless given) with
    ``hparams.yaml`` beside the events. Built by name (``loggers=["tensorboard"]``, ``conf/logger/``):
    into the run directory itself (``in_run_dir``).

    Args:
        save_dir: the folder the logger's folders go into (see above).
        name: the folder under ``save_dir`` (None or "": none).
        version: the ``version_<n>`` folder under ``name`` (an int n, or a string used as the folder's
            name; None: the next free version).
        sub_dir: one more folder under the version's, where the events go (None: none).
        log_graph: also the model's graph (GRAPHS tab), traced once per call with the module's
            ``example_input_array`` (trainer/loggers/tensorboard_graph.py).
        default_hp_metric: with the hyperparameters, also an ``hp_metric`` of -1 (as Lightning).
        prefix: put before every metric name, joined with "-".
        flush_secs: write pending events to disk at least this often.
        max_queue: events buffered before a write.
        **writer_options: ``comment``, ``purge_step`` and ``filename_suffix``, as ``SummaryWriter``'s;
            other keywords are refused.
    """

    def __init__(self, save_dir: Any, name: str | None = "lightning_logs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "", sub_dir: Any = None,
                 flush_secs: int = 30, max_queue: int = 10, **writer_options: Any):
        unknown = sorted(set(writer_options) - set(WRITER_OPTIONS))
        if unknown:
            raise TypeError(f"TensorBoardLogger got unknown option(s) {unknown}; it takes save_dir, name, version, "
                            f"default_hp_metric, prefix, sub_dir, flush_secs, max_queue, {', '.join(WRITER_OPTIONS)}")
        self._dirs = VersionedDir(save_dir, name, version, sub_dir)
        self.log_graph_enabled = bool(log_graph)  # Lightning's log_graph
        self._default_hp_metric = default_hp_metric
        self._prefix = prefix
        self._writer_options = dict(writer_options, flush_secs=flush_secs, max_queue=max_queue)
        self._hparams_file = True  # Lightning's hparams.yaml beside the events (not in a run directory)
        self._events: BackgroundWriter | None = None  # made at the first write
        # in a trainer's run, writes are queued for the writer's thread; used directly (no run), each
        # write is done when the call returns (nothing left running behind the caller's back)
        self._queued_writes = False

    @classmethod
    def in_run_dir(cls, run_dir: str, flush_secs: int = 30, max_queue: int = 10,
                   log_dir: str | None = None) -> TensorBoardLogger:
        """The logger ``loggers=["tensorboard"]`` builds: the event file in ``log_dir`` (a DeepSpeed
        config's ``tensorboard.output_path/job_name``), else in the run directory itself."""
        logger = cls(log_dir or run_dir, name="", version="", default_hp_metric=False,
                     flush_secs=flush_secs, max_queue=max_queue)
        logger._hparams_file = False
        logger._queued_writes = True
        return logger

    def open_in_run(self) -> None:
        """A run writes through the writer's thread: a logging step only queues its numbers."""
        self._queued_writes = True


    @property
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter`` (rank 0; a DummyExperiment elsewhere)."""
        if not writes_here():
            return DummyExperiment()
        return self._background().writer()

    def _background(self) -> BackgroundWriter:
        if self._events is None:
            self._events = BackgroundWriter(self._open_writer)
        return self._events

    def _submit(self, job: Any) -> None:
        """Queue ``job`` for the writer's thread; outside a run, wait until it is written."""
        self._background().submit(job)
        if not self._queued_writes:
            self._background().writer()

    def _open_writer(self) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(self.log_dir, exist_ok=True)
        return SummaryWriter(log_dir=self.log_dir, **self._writer_options)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not writes_here():
            return
        scalars = []
        for name, value in metrics.items():
            value = python_number(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars.append((f"{self._prefix}-{name}" if self._prefix else name, value))
        if scalars:
            self._submit(lambda writer: _add_scalars(writer, scalars, step))

    def log_hyperparams(self, params: Mapping[str, Any], metrics: Mapping[str, float] | None = None,
                        step: int | None = None) -> None:
        if not writes_here():
            return
        redacted = plain_keys(redact_secrets(dict(params)))
        text = json.dumps(redacted, indent=2, default=str)
        if metrics is None and self._default_hp_metric:
            metrics = {"hp_metric": -1}
        flat, hp_metrics = _flatten(redacted), dict(metrics or {})

        def write(writer: Any) -> None:
            writer.add_text("config", "```\n" + text + "\n```")
            # Also TensorBoard's HPARAMS tab (as Lightning): flat "a/b" names, scalar values.
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(flat, hp_metrics):
                writer.file_writer.add_summary(summary)

        self._submit(write)
        if metrics:
            self.log_metrics(metrics, step)  # (as Lightning: no step unless given)
        if self._hparams_file:
            write_hparams_yaml(self.log_dir, params)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """With ``log_graph=True``, the graph of ``model`` traced on ``input_array`` (None: its
        ``example_input_array``); a UserWarning when there is no input to trace with (rank 0)."""
        if not self.log_graph_enabled or not writes_here():
            return
        example = graph_input(model, input_array)
        if example is not None:
            add_graph(self.experiment, model, example)

    def resume_at(self, step: int, history: list | None, dropped_from: int | None) -> None:
        """A resume from the checkpoint at ``step``: TensorBoard shows the steps the killed run wrote
        after it no more (a ``SessionLog.START`` event at the first step to write again: TensorBoard
        drops the events at that step and later ones that came before it), and the steps up to it
        that the event files lack (written every ``flush_secs``, so a kill loses the last ones) are
        written again from ``history``."""
        if not writes_here():
            return
        from trainer.loggers.resume_history import merged_by_step

        if self._events is not None and self._events.is_open:
            self._events.writer()  # what is queued, written first
        os.makedirs(self.log_dir, exist_ok=True)  # (nothing written yet when the run logged no config)
        rows = merged_by_step(history or [], 0, step)
        again = step + 1 if dropped_from is None else min(step + 1, dropped_from)
        if rows:
            held = self._scalars_shown()
            missing = [row_step for row_step, values in rows if row_step < again and any(
                (f"{self._prefix}-{k}" if self._prefix else k) not in held.get(row_step, ())
                for k, v in values.items() if _is_scalar(v))]
            again = min(missing, default=again)
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._write_after_older_files()
        self.experiment.file_writer.add_event(Event(step=again, session_log=SessionLog(status=SessionLog.START)))
        for row_step, values in rows:
            if row_step >= again:
                self.log_metrics(values, row_step)
        self.experiment.flush()

    def _write_after_older_files(self) -> None:
        """TensorBoard reads a folder's event files in name order, and a name starts with the second
        the file was opened in: a file opened in the same second as an older one may be read before it
        (its purge too early, the older events shown after it). Then this writer's file is closed and
        a new one opened once the clock is past that second (at most a second's wait)."""
        import time

        events = self._background()
        own = os.path.basename(events.writer().file_writer.event_writer._file_name) if events.is_open else None
        others = [_opened_at(name) for name in os.listdir(self.log_dir) if name != own and _opened_at(name) is not None]
        newest = max(others, default=None)
        if newest is None or (own is not None and _opened_at(own) > newest):
            return
        events.close()
        while int(time.time()) <= newest and newest - time.time() < 2:
            time.sleep(0.05)

    def _scalars_shown(self) -> dict[int, set[str]]:
        """step -> the scalar names TensorBoard shows at it, from the event files in ``log_dir``."""
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

        accumulator = EventAccumulator(self.log_dir, size_guidance={SCALARS: 0})
        accumulator.Reload()
        shown: dict[int, set[str]] = {}
        for tag in accumulator.Tags()["scalars"]:
            for event in accumulator.Scalars(tag):
                shown.setdefault(event.step, set()).add(tag)
        return shown

    def save(self) -> None:
        if self._events is not None and self._events.is_open:
            self._events.writer().flush()
        self._hparams_yaml_if_missing()

    def finalize(self, status: str = "success") -> None:
        if self._events is not None:
            self._events.close()
        self._hparams_yaml_if_missing()

    def _hparams_yaml_if_missing(self) -> None:
        """As Lightning's: once the version folder exists, it holds an ``hparams.yaml`` (an empty one when
        no hyperparameters were logged)."""
        if self._hparams_file and writes_here() and os.path.isdir(self.log_dir) and not os.path.isfile(
                os.path.join(self.log_dir, "hparams.yaml")):
            write_hparams_yaml(self.log_dir, {})

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_events"] = None  # a copy (a spawned worker's) opens its own writer
        return state


def _add_scalars(writer: Any, scalars: list[tuple[str, float]], step: int | None) -> None:
    for name, value in scalars:
        writer.add_scalar(name, value, global_step=step)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _opened_at(name: str) -> int | None:
    """The second in an event file's name (``events.out.tfevents.<second>.<host>...``), else None."""
    parts = name.split(".")
    if name.startswith("events.out.tfevents.") and len(parts) > 3 and parts[3].isdigit():
        return int(parts[3])
    return None


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``{"a/b": value}``; values other than numbers, strings and bools as text."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat
