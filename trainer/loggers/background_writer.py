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


@atexit.register
def _write_queued_at_exit() -> None:
    for writer in list(_RUNNING):
        try:
            writer.close()
        except Exception:  # exiting: an error of a logger's write must not hide the program's own
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
