"""A writer opened and fed on a thread of its own: what a logger hands it on a logging step is queued
(values already turned into Python numbers), and the import of the writer's library, the opening
of its files and the building of its records happen off the training step's path."""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable

#: the writers whose thread runs: what they hold queued is written at interpreter exit (a script that
#: logged without closing its logger loses nothing the writer's own buffering would have kept)
_RUNNING: weakref.WeakSet = weakref.WeakSet()


def _close_all(writers: list) -> None:
    for writer in writers:
        try:
            writer.close()
        except Exception:  # exiting: an error of a logger's write must not hide the program's own
            pass


@atexit.register
def _write_queued_at_exit() -> None:
    _close_all(list(_RUNNING))


def python_number(value: Any) -> Any:
    """A one-element tensor or NumPy value as its Python number (read when it is queued, so the
    writer thread never touches a tensor the training goes on changing); anything else as it is."""
    if isinstance(value, (int, float, str)) or not hasattr(value, "item"):
        return value
    size = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
    return value.item() if size == 1 else value


class NothingToClose:
    """The writer of a logger whose jobs write through the logger's own state (a W&B run, an MLflow
    client that the first job starts): waiting for the jobs is all ``writer()`` and ``close()`` do."""

    def close(self) -> None:
        pass


class BackgroundWriter:
    """Calls ``job(writer)`` for each submitted job, in order, on one daemon thread; the writer is
    ``open_writer()``'s result, made by that thread before its first job.

    ``writer()`` waits until every job submitted so far is done and returns the writer (opening it
    on the caller's thread when no job came yet): what a caller does with it directly comes after
    what was queued. ``close()`` waits for the jobs, ends the thread and closes the writer; a later
    job starts a new thread and a new writer. A job's error is raised by the next ``writer()`` or
    ``close()``, and the jobs after it are dropped.
    """

    def __init__(self, open_writer: Callable[[], Any]):
        self._open_writer = open_writer
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._writer: Any = None
        self._error: BaseException | None = None

    @property
    def is_open(self) -> bool:
        return self._writer is not None or self._thread is not None

    def submit(self, job: Callable[[Any], None]) -> None:
        if self._thread is None:
            self._thread = _WriterThread(self)
            self._thread.start()
            _RUNNING.add(self)
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if isinstance(job, threading.Event):
                job.set()
                continue
            if self._error is not None:
                continue
            try:
                if self._writer is None:
                    self._writer = self._open_writer()
                job(self._writer)
            except BaseException as error:  # raised on the caller's thread at its next wait
                self._error = error

    def _wait(self) -> None:
        if self._thread is not None:
            done = threading.Event()
            self._jobs.put(done)
            done.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def writer(self) -> Any:
        self._wait()
        if self._writer is None:
            self._writer = self._open_writer()
        return self._writer

    def stop_thread(self) -> None:
        """End the thread once the jobs queued so far are done; the writer stays open (a later job
        starts a new thread)."""
        thread = self._thread
        if thread is not None:
            self._jobs.put(None)
            thread.join()
            self._thread = None
            _RUNNING.discard(self)

    def close(self) -> None:
        try:
            self._wait()
        finally:
            self.stop_thread()
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()


class QueuedWrites:
    """A logger's writes on a `BackgroundWriter` of its own (made at the first write; a copy of the
    logger, pickled for a spawned worker, makes its own): a mixin for loggers whose jobs reach
    their state through the logger itself (``NothingToClose``)."""

    _writes: BackgroundWriter | None = None

    def _submit(self, job: Callable[[Any], None]) -> None:
        if self._writes is None:
            self._writes = BackgroundWriter(NothingToClose)
        self._writes.submit(job)

    def _written(self) -> None:
        """Wait for the queued writes (raising the first one's error, if one failed)."""
        if self._writes is not None and self._writes.is_open:
            self._writes.writer()

    def save(self) -> None:
        """Wait until what is queued is written (Lightning's flush hook; raises a write's error)."""
        self._written()

    def _close_writes(self) -> None:
        """Write what is queued and end the thread (raising a write's error)."""
        if self._writes is not None:
            self._writes.close()


class _WriterThread(threading.Thread):
    """The daemon thread of a `BackgroundWriter`; ``stop()`` ends it after the jobs queued so far (what a
    test harness that stops left-over daemon threads calls)."""

    def __init__(self, owner: BackgroundWriter):
        super().__init__(target=owner._work, name="logger-writer", daemon=True)
        self._owner = weakref.ref(owner)

    def stop(self) -> None:
        owner = self._owner()
        if owner is not None and owner._thread is self:
            owner.stop_thread()
