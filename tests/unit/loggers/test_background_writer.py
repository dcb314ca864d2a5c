"""The TensorBoard logger's writer thread (trainer/loggers/background_writer.py): a logging step only
queues its numbers; the import, the event file and the records are made on the writer's thread, in
the order the calls came, and everything queued is written before ``experiment``, ``save`` and
``finalize`` return."""

from __future__ import annotations

import threading

import pytest

from trainer.loggers import TensorBoardLogger
from trainer.loggers.background_writer import BackgroundWriter

pytestmark = pytest.mark.timeout(120)


class FakeWriter:
    """Records each call with the thread that made it."""

    def __init__(self, log: list):
        self.log = log
        self.log.append(("open", threading.current_thread().name))

    def add_scalar(self, name, value, global_step=None):
        self.log.append(("scalar", name, value, global_step, threading.current_thread().name))

    def flush(self):
        self.log.append(("flush", threading.current_thread().name))

    def close(self):
        self.log.append(("close", threading.current_thread().name))


def test_jobs_run_in_order_on_the_writer_thread_and_writer_waits_for_them():
    log: list = []
    release = threading.Event()
    events = BackgroundWriter(lambda: FakeWriter(log))
    events.submit(lambda writer: release.wait(10))  # holds the thread: later jobs stay queued
    for step in range(3):
        events.submit(lambda writer, step=step: writer.add_scalar("loss", float(step), step))
    assert [entry for entry in log if entry[0] == "scalar"] == []  # nothing written on the caller's thread
    release.set()
    writer = events.writer()
    assert [entry[1:4] for entry in log if entry[0] == "scalar"] == [("loss", 0.0, 0), ("loss", 1.0, 1), ("loss", 2.0, 2)]
    assert {entry[-1] for entry in log} == {"logger-writer"}  # opened and written off the caller's thread
    assert isinstance(writer, FakeWriter)
    events.close()
    assert log[-1] == ("close", threading.current_thread().name)
    # after a close, a job starts a new thread and a new writer
    events.submit(lambda writer: writer.add_scalar("loss", 9.0, 9))
    events.close()
    assert [entry[0] for entry in log[-3:]] == ["open", "scalar", "close"]


def test_a_failed_job_is_raised_at_the_next_wait_and_the_jobs_after_it_are_dropped():
    log: list = []
    events = BackgroundWriter(lambda: FakeWriter(log))

    def broken(writer):
        raise OSError("disk full")

    events.submit(broken)
    events.submit(lambda writer: writer.add_scalar("loss", 1.0, 1))
    with pytest.raises(OSError, match="disk full"):
        events.writer()
    assert not [entry for entry in log if entry[0] == "scalar"]
    events.close()  # the error was raised once; closing then closes the writer
    assert log[-1][0] == "close"


def test_a_writer_asked_for_before_any_job_opens_on_the_caller_thread():
    log: list = []
    events = BackgroundWriter(lambda: FakeWriter(log))
    assert not events.is_open
    events.writer()
    assert log == [("open", threading.current_thread().name)]
    events.close()


def test_tensorboard_logging_step_queues_and_finalize_writes_every_scalar(tmp_path, monkeypatch):
    log: list = []
    logger = TensorBoardLogger.in_run_dir(str(tmp_path))
    monkeypatch.setattr(logger, "_open_writer", lambda: FakeWriter(log))
    release = threading.Event()
    logger._background().submit(lambda writer: release.wait(10))
    logger.log_metrics({"train/loss": 0.5, "lr": 1e-3, "flag": True}, step=10)
    logger.log_metrics({"train/loss": 0.25}, step=20)
    assert not [entry for entry in log if entry[0] == "scalar"]  # the step returned before any write
    release.set()
    logger.finalize()
    scalars = [entry[1:5] for entry in log if entry[0] == "scalar"]
    assert scalars == [("train/loss", 0.5, 10, "logger-writer"), ("lr", 1e-3, 10, "logger-writer"),
                       ("train/loss", 0.25, 20, "logger-writer")]  # booleans are no scalars, as before


def test_tensorboard_events_are_on_disk_after_finalize(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger.in_run_dir(str(tmp_path))
    logger.log_hyperparams({"optimizer": {"lr": 0.1}})
    for step in range(1, 4):
        logger.log_metrics({"train/loss": 1.0 / step}, step=step)
    logger.finalize()
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [(e.step, round(e.value, 4)) for e in accumulator.Scalars("train/loss")] == [(1, 1.0), (2, 0.5), (3, 0.3333)]
    assert "config/text_summary" in accumulator.Tags()["tensors"]


def test_what_is_queued_is_written_at_interpreter_exit(tmp_path):
    import subprocess
    import sys

    script = f"""
from trainer.loggers import TensorBoardLogger
logger = TensorBoardLogger.in_run_dir({str(tmp_path)!r})
for step in range(1, 51):
    logger.log_metrics({{"train/loss": 1.0 / step}}, step=step)
"""  # no finalize: the program just ends
    subprocess.run([sys.executable, "-c", script], check=True, timeout=240)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("train/loss")] == list(range(1, 51))
