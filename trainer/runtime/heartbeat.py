"""Heartbeats: a rank that stops responding without dying is named, and the job ends.

A rank stopped with SIGSTOP, on a frozen node, or hung with the interpreter held does not die, so
nothing sees it go: its peers wait in their next collective until the collective timeout, and then
each reports *itself* as the rank that failed. Here every rank runs a thread that adds 1 to its own
counter in the job's store every ``interval`` seconds. The thread beats while the rank's main thread
works (torch and the store release the interpreter while they wait), so a rank that is merely slow (a
long step, a checkpoint save, validation, data loading) keeps beating; only a process that is stopped
or hung as a whole goes silent. A rank silent for the collective timeout is the one named:

- workers the trainer spawned: the launcher hosts the store and watches every rank's counter
  (``Staleness``); it ends the job and ``WorkerFailed`` names the silent rank (trainer/runtime/supervision.py).
- under torchrun or SLURM (``start``): rank r watches rank r + 1 (each rank is watched by one other, so
  the store serves a few requests per rank and interval). The watcher logs one line naming the silent
  rank, SIGKILLs it when it runs on the same host (a stopped process acts on nothing else), and ends
  its own process with exit code 1, so the launcher ends the others. A store that stops answering
  (under SLURM rank 0 hosts it) is reported the same way, naming the store's host.

A rank that is alive but deadlocked keeps beating: the collective timeout still ends the job, on the
rank that waited; the launcher of spawned workers then adds that every rank was still beating.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

#: the store keys: ``<prefix>/<rank>`` a rank's beat counter, ``<prefix>/who/<rank>`` its "host pid"
PREFIX = "trainer/heartbeat"
#: added to a rank's counter when it leaves the job on purpose: its silence from then on is expected
LEFT = 1 << 40

log = logging.getLogger(__name__)


def interval_for(silence_s: float) -> float:
    """How often a rank beats: ten beats per silence limit (so a limit is missed only by a rank that
    missed ten beats in a row), between 0.2 s and 5 s (a store request every 5 s per rank costs
    nothing, and a peer that still beats at the long interval of the first join is not taken for
    silent once the run sets a shorter collective timeout)."""
    return min(max(silence_s / 10.0, 0.2), 5.0)


def counter_key(rank: int) -> str:
    return f"{PREFIX}/{rank}"


def who_key(rank: int) -> str:
    return f"{PREFIX}/who/{rank}"


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``T``: stopped; ``t``: stopped by a tracer; ``Z``: a
    zombie) from /proc, or None where there is no /proc entry (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class Staleness:
    """When each watched rank's counter last changed, by the watcher's own clock (so no two
    machines' clocks are ever compared). A rank whose counter passed ``LEFT`` left on purpose."""

    ranks: list[int]
    started: float
    values: dict[int, int] = field(default_factory=dict)
    changed_at: dict[int, float] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)

    def observe(self, rank: int, value: int, now: float) -> None:
        if value >= LEFT:
            self.left.add(rank)
        elif self.values.get(rank) != value:
            self.values[rank] = value
            self.changed_at[rank] = now

    def restart(self, now: float) -> None:
        """Count every watched rank's silence from ``now``."""
        self.started = now
        self.changed_at = {rank: now for rank in self.changed_at}

    def silent_for(self, rank: int, now: float) -> float:
        """Seconds since ``rank`` last beat (since the watch started, if it never did); 0 once it left."""
        if rank in self.left:
            return 0.0
        return now - self.changed_at.get(rank, self.started)

    def silent(self, now: float, limit: float, beaten_only: bool = False) -> list[tuple[int, float]]:
        """``(rank, seconds)`` of every watched rank silent for more than ``limit`` seconds, most silent
        first; ``beaten_only``: of the ranks that beat at least once (one still starting is not silent)."""
        found = [(rank, self.silent_for(rank, now)) for rank in self.ranks if not beaten_only or rank in self.values]
        return sorted(((r, s) for r, s in found if s > limit), key=lambda item: -item[1])


class Heartbeat:
    """This rank's beating thread, and (``watch=True``) the watch over rank ``rank + 1``.

    ``connect`` opens the thread's own store client (never the process group's: a client is not
    shared between threads). ``silence_s`` is the collective timeout, settable later (``train.py``
    joins with a long timeout and the run then sets the configured one)."""

    def __init__(self, connect: Callable[[], Any], rank: int, world_size: int, silence_s: float, watch: bool,
                 store_name: str = "the job's store"):
        self.connect, self.rank, self.world_size = connect, rank, world_size
        self.silence_s = silence_s
        self.store_name = store_name
        self.watched = (rank + 1) % world_size if watch and world_size > 1 else None
        self.staleness = Staleness([self.watched] if self.watched is not None else [], time.monotonic())
        self.last_answer = time.monotonic()  # when the store last answered this rank
        self.peer: str | None = None  # the watched rank's "host pid"
        self._stopping = threading.Event()
        # Set to end a thread's wait early: on stop, and when the interval changes (a thread that
        # slept out the old, longer interval would miss beats its watcher now expects).
        self._wake = {"beat": threading.Event(), "watch": threading.Event()}
        self._reported = False
        self._beat = threading.Thread(target=self._beat_loop, name="trainer-heartbeat", daemon=True)
        # The watch never touches the store: it sees a store that stopped answering too.
        self._watch = threading.Thread(target=self._watch_loop, name="trainer-heartbeat-watch", daemon=True)

    @property
    def interval(self) -> float:
        return interval_for(self.silence_s)

    def set_silence(self, silence_s: float) -> None:
        # The watched rank, and the store, get the new limit counted from now (a peer may set the same
        # limit a moment later; this rank's beat thread slept out the old interval).
        self.staleness.restart(time.monotonic())
        self.last_answer = time.monotonic()
        self.silence_s = silence_s
        for event in self._wake.values():
            event.set()

    def _sleep(self, thread: str) -> bool:
        """Wait one interval (less if woken); True once the heartbeat is stopping."""
        self._wake[thread].wait(self.interval)
        self._wake[thread].clear()
        return self._stopping.is_set()

    def start(self) -> Heartbeat:
        self._beat.start()
        if self.watched is not None:
            self._watch.start()
        return self

    def stop(self, failed: bool = False) -> None:
        """Stop beating and tell the watchers this rank leaves. ``failed``: this rank is ending on an
        error; if its watched rank has been silent for a while (two beats), that rank is named as
        the likely cause (a collective that timed out waiting for it)."""
        if failed and self.watched is not None:
            now = time.monotonic()
            silent = self.staleness.silent(now, 2 * self.interval)
            if silent:
                self._report(f"rank {self.watched} stopped responding: no heartbeat for {silent[0][1]:.0f} s"
                             f"{self._peer_text()}; rank {self.rank} failed waiting for it", kill_peer=True, exit=False)
        self._stopping.set()
        for event in self._wake.values():
            event.set()
        if self._beat.is_alive():
            self._beat.join(timeout=5.0)  # (longer only if the store stopped answering)

    # ----- the threads ---------------------------------------------------------------------------
    def _beat_loop(self) -> None:
        try:
            store = self.connect()
            store.set(who_key(self.rank), f"{socket.gethostname()} {os.getpid()}")
            while not self._stopping.is_set():
                store.add(counter_key(self.rank), 1)
                if self.watched is not None:
                    self.staleness.observe(self.watched, store.add(counter_key(self.watched), 0), time.monotonic())
                    if self.peer is None and store.check([who_key(self.watched)]):
                        self.peer = store.get(who_key(self.watched)).decode()
                self.last_answer = time.monotonic()
                if self._sleep("beat"):
                    break
            store.add(counter_key(self.rank), LEFT)
        except Exception:  # the store went away (the job is ending); the watch reports a store that stays silent
            return

    def _watch_loop(self) -> None:
        while not self._sleep("watch"):
            now = time.monotonic()
            if now - self.last_answer > self.silence_s:
                self._report(f"{self.store_name} did not answer for {now - self.last_answer:.0f} s (more than "
                             f"trainer.collective_timeout_s={self.silence_s:g}): its host stopped responding",
                             kill_peer=False, exit=True)
            silent = self.staleness.silent(now, self.silence_s)
            if silent:
                self._report(f"rank {self.watched} stopped responding: no heartbeat for {silent[0][1]:.0f} s (more "
                             f"than trainer.collective_timeout_s={self.silence_s:g}){self._peer_text()}",
                             kill_peer=True, exit=True)

    # ----- ending the job ------------------------------------------------------------------------
    def _peer_text(self) -> str:
        if self.peer is None:
            return ""
        host, _, pid = self.peer.partition(" ")
        return f" (host {host}, pid {pid})"

    def _peer_here(self) -> int | None:
        """The watched rank's pid if it runs on this host and is still there (not a zombie)."""
        if self.peer is None:
            return None
        host, _, pid = self.peer.partition(" ")
        if host != socket.gethostname() or not pid.isdigit() or process_state(int(pid)) in (None, "Z"):
            return None
        return int(pid)

    def _report(self, what: str, kill_peer: bool, exit: bool) -> None:
        """Log ``what`` (and under torchrun, write it to the error file its agent shows), SIGKILL the
        watched rank if it runs here (SIGTERM waits until a stopped process is continued), and with
        ``exit`` end this process: the line comes first, so it is there whoever sees a death first."""
        if self._reported:
            return
        self._reported = True
        pid = self._peer_here() if kill_peer else None
        line = what + (f"; killing it (pid {pid})" if pid is not None else "")
        line += f"; rank {self.rank} ends the job" if exit else ""
        log.error(line)  # (with no handler configured, logging's last resort prints it on stderr)
        if exit:
            _write_elastic_error(line)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if exit:
            os._exit(1)  # the main thread waits inside a collective and would not see an exception


def _write_elastic_error(line: str) -> None:
    """Under torchrun: the line in this worker's error file, so the agent's failure summary shows it
    (the format torch's ``@record`` writes)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"message": {"message": f"RankStoppedResponding: {line}",
                                   "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}, handle)
    except OSError:
        pass


#: this process's heartbeat (one process, one rank)
_current: Heartbeat | None = None


def start(connect: Callable[[], Any], rank: int, world_size: int, silence_s: float, watch: bool,
          store_name: str = "the job's store") -> Heartbeat:
    """Start this process's heartbeat (replacing a previous one)."""
    global _current
    stop()
    _current = Heartbeat(connect, rank, world_size, silence_s, watch, store_name).start()
    return _current


def set_silence(silence_s: float) -> None:
    """The collective timeout changed: so does the silence a watcher allows."""
    if _current is not None:
        _current.set_silence(silence_s)


def running() -> bool:
    return _current is not None


def stop(failed: bool = False) -> None:
    """Stop this process's heartbeat, if any (see ``Heartbeat.stop``)."""
    global _current
    if _current is not None:
        current, _current = _current, None
        current.stop(failed)


# A beating thread must be gone before the interpreter finalizes: a daemon thread coming back from the
# store's C++ call then would abort the process.
atexit.register(stop)
