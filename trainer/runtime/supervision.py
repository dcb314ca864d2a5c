"""The launcher's watch over the workers it spawned: the first to fail, or to stop responding, ends the job.

A worker that dies or raises ends the job with a ``WorkerFailed`` that names its rank (the first one to
fail: the others usually fail because it left). A worker that stops responding without dying (stopped,
frozen, hung as a whole) is seen by its heartbeat (trainer/runtime/heartbeat.py): silent for the
collective timeout, it is named, and every worker is SIGKILLed (a stopped process acts on no other
signal until it is continued), so no process of the job is left. The fork server that forked the
workers (trainer/runtime/launch.py) reports how each ends; if it dies, every worker looks dead (exit
code 255) while they run on as orphans: the server is named, and every worker is SIGKILLed.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal
import time
from typing import Any

import torch.multiprocessing as mp

from trainer.runtime.heartbeat import Staleness, counter_key, interval_for, process_state


class WorkerFailed(RuntimeError):
    """A spawned worker died, raised or stopped responding; the message names its rank."""


class HeartbeatWatch:
    """Every rank's beat counter, read from the store the launcher hosts."""

    def __init__(self, store: Any, nprocs: int, silence_s: float):
        self.store, self.silence_s = store, silence_s
        self.staleness = Staleness(list(range(nprocs)), time.monotonic())

    def read(self, alive: list[int]) -> None:
        now = time.monotonic()
        self.staleness.ranks = alive  # a worker that ended is not silent, it is done
        for rank in alive:
            self.staleness.observe(rank, int(self.store.add(counter_key(rank), 0)), now)

    def silent(self, limit: float, processes: list[Any]) -> list[tuple[int, float]]:
        """The ranks silent for more than ``limit`` since their last beat. A worker still starting (the
        fork server's first start imports torch) has not beaten yet and is not silent, unless it is
        stopped (one stopped before its first beat)."""
        now = time.monotonic()
        silent = self.staleness.silent(now, limit, beaten_only=True)
        named = {rank for rank, _ in silent}
        for rank, seconds in self.staleness.silent(now, limit):
            if rank not in named and process_state(processes[rank].pid) in ("T", "t"):
                silent.append((rank, seconds))
        return silent


def _kill(processes: list[Any], which: list[int]) -> None:
    for index in which:
        try:
            os.kill(processes[index].pid, signal.SIGKILL)
        except (OSError, TypeError):
            pass
    for index in which:
        processes[index].join(10)


def _silent_line(silent: list[tuple[int, float]], processes: list[Any], silence_s: float) -> str:
    rank, seconds = silent[0]
    others = f" (rank(s) {sorted(r for r, _ in silent[1:])} were silent too)" if len(silent) > 1 else ""
    state = " (stopped)" if process_state(processes[rank].pid) in ("T", "t") else ""
    return (f"rank {rank} (pid {processes[rank].pid}){state} stopped responding: no heartbeat for {seconds:.0f} s "
            f"(trainer.collective_timeout_s={silence_s:g}){others}")


def supervise(context: Any, failures: Any, store: Any, silence_s: float, fork_server: int | None = None) -> None:
    """Wait for the workers of ``context`` (``torch.multiprocessing.start_processes(join=False)``);
    return when all of them ended well, raise ``WorkerFailed`` naming the first to fail or to go silent,
    or the fork server (pid ``fork_server``, None where the workers were not forked by one) if it died."""
    processes = context.processes
    watch = HeartbeatWatch(store, len(processes), silence_s)
    interval = interval_for(silence_s)
    pending = {process.sentinel: index for index, process in enumerate(processes)}
    while pending:
        for sentinel in multiprocessing.connection.wait(list(pending), timeout=interval):
            index = pending.pop(sentinel)
            processes[index].join()
            if processes[index].exitcode == UNREADABLE_STATUS:
                _stop_if_fork_server_died(processes, fork_server)
            if processes[index].exitcode != 0:
                _failed(context, failures, watch, interval, first=index)
        try:
            watch.read([pending[s] for s in pending])
        except Exception:  # (the launcher's own store: not expected) no diagnosis this round, the wait goes on
            continue
        silent = watch.silent(silence_s, processes)
        if silent:
            line = _silent_line(silent, processes, silence_s)  # (before the kill: it says whether it was stopped)
            _kill(processes, list(range(len(processes))))
            raise WorkerFailed(line + "; every rank was stopped")


#: the exit code multiprocessing gives a worker whose status it could not read from the fork server
#: (``multiprocessing.popen_forkserver.Popen.poll``): every worker's, once the server has died
UNREADABLE_STATUS = 255


def fork_server_end(pid: int | None, wait_s: float = 0.0) -> str | None:
    """How the fork server ``pid`` ended ("exited with code 1", "was killed by SIGKILL"), or None while
    it runs, or where that cannot be told (no ``pid``; no ``os.waitid``; not this process's child).
    Read without reaping it (``WNOWAIT``): multiprocessing reaps it, and starts another, at its next
    start of a process. Waits up to ``wait_s`` for the end: the server's pipes to the launcher close
    (the workers' sentinels) a moment before it is a zombie."""
    waitid = getattr(os, "waitid", None)
    if pid is None or waitid is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            status = waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return None
        if status is not None:
            return _end_words(status.si_status if status.si_code == os.CLD_EXITED else -status.si_status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _end_words(code: int) -> str:
    """``exited with code C`` for an exit status, ``was killed by SIGNAME`` for a signal (negative)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _stop_if_fork_server_died(processes: list[Any], fork_server: int | None) -> None:
    """A worker "exited with code 255": if that is the fork server's death (it reports how each
    worker ends, so every worker reads so), raise ``WorkerFailed`` naming it, after SIGKILLing every
    worker (orphans now, still running: torch's clean-up would take them for ended)."""
    end = fork_server_end(fork_server, wait_s=1.0)
    if end is None:
        return
    _kill(processes, list(range(len(processes))))
    raise WorkerFailed(f"the fork server that starts the ranks (pid {fork_server}) {end}; the launcher learns from it "
                       "how each rank ends, so it cannot watch them without it; every rank was stopped")


def _exit_line(process: Any, rank: int) -> str:
    return f"rank {rank} (pid {process.pid}) {_end_words(process.exitcode)}"


def _failed(context: Any, failures: Any, watch: HeartbeatWatch, interval: float, first: int) -> None:
    """A worker ended with an error. If that error is a timeout, a rank silent for two beats or more
    is its likely cause (the collective waited for it): it is named. A stopped rank is named in any
    case. Both are killed now: torch's clean-up of the rest sends SIGTERM first, which a stopped
    process holds (for 30 s, until torch sends SIGKILL)."""
    processes = context.processes
    time.sleep(0.1)  # the failing worker put its report before it exited; the queue's feeder may lag
    reports = []
    while not failures.empty():
        reports.append(failures.get())
    timed_out = any("timed out" in report[4].lower() for report in reports)
    alive = [i for i, p in enumerate(processes) if p.exitcode is None and p.is_alive()]
    try:
        watch.read(alive)
    except Exception:  # the store is the launcher's own; a failure here only loses the diagnosis
        pass
    silent = watch.silent(2 * interval, processes) if timed_out else []
    stopped = [i for i in alive if process_state(processes[i].pid) in ("T", "t")]
    silent += [(i, watch.staleness.silent_for(i, time.monotonic())) for i in stopped if i not in dict(silent)]
    cause = _silent_line(silent, processes, watch.silence_s) if silent else None
    _kill(processes, [rank for rank, _ in silent])
    # After a timeout the other ranks are stuck in collectives: a short grace (torch's SIGTERM, then
    # SIGKILL) instead of the default 30 s for ranks that may still be saving.
    grace = 2.0 if timed_out else None
    try:
        while not context.join(grace_period=grace):
            pass
    except mp.ProcessRaisedException as error:
        while not failures.empty():
            reports.append(failures.get())
        if not reports:
            raise WorkerFailed(cause or f"rank {error.error_index} (pid {error.error_pid}) failed:\n{error.msg}") from None
        if cause is None and first not in {r for _, r, *_ in reports}:
            # The first to end died without raising (os._exit, a signal, the OOM killer): the ranks
            # that raised did so because it left (a reset connection), so it is the one named.
            raise WorkerFailed(f"{_exit_line(processes[first], first)}; rank(s) {sorted({r for _, r, *_ in reports})} "
                               "failed after it; the other ranks were stopped") from None
        _, rank, pid, trace, summary = min(reports)  # the first to fail
        if cause is not None:  # the failure is a consequence: one line, the waiting rank's error in short
            raise WorkerFailed(f"{cause}; rank {rank} failed waiting for it ({_short(summary)}); every rank was "
                               "stopped") from None
        # The cause's traceback once, on stderr (and in train.log under train.py); the exception
        # raised here carries one line.
        logging.getLogger("trainer.runtime.launch").error("rank %d (pid %d) failed:\n%s", rank, pid, trace.rstrip())
        others = sorted({r for _, r, *_ in reports} - {rank})
        hint = ""
        if "timed out" in summary.lower():
            hint = ("; no rank had stopped responding (every heartbeat was current): a rank is alive but did not "
                    "reach the collective (a deadlock, or ranks that took different paths)")
        raise WorkerFailed(
            f"rank {rank} failed: {summary} (traceback above){hint}; "
            + (f"rank(s) {others} failed after it" if others else "the other ranks were stopped")
        ) from None
    except mp.ProcessExitedException as error:
        if cause is not None:
            raise WorkerFailed(f"{cause}; every rank was stopped") from None
        del error  # (torch names the first ended process it looked at; ``first`` is the one that ended first)
        raise WorkerFailed(f"{_exit_line(processes[first], first)}; the other ranks were stopped") from None
    raise WorkerFailed(cause or "a worker failed")  # (join raises whenever a worker failed)


def _short(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
