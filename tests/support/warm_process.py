"""Run a test's function in a process of its own, forked from a warm server.

A test that kills or signals a run needs the run in another process (``python tests/support/run_fit.py
spec``), but a fresh interpreter pays 2-4 s importing torch and the trainer before any work. Here
the process is forked from multiprocessing's fork server (a clean process, never pytest itself,
that imported torch and the trainer once; the trainer's own ``spawn`` uses the same server), and
then behaves as that subprocess would: the caller's environment and working directory, a session
of its own (a timeout kills all of it, ranks included), its stdout and stderr captured, and an exit
status (``-9`` when SIGKILLed, ``1`` on an uncaught exception).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable

from trainer.runtime.launch import FORK_SERVER_PRELOAD

#: what the fork server imports once, before it forks anything: torch, the modules DDP and FSDP
#: import on first use (torch._dynamo: ~2 s of CPU per process), the trainer and the tests' helpers.
#: A module that does not exist is skipped (multiprocessing.forkserver.main ignores an ImportError).
PRELOAD = [*FORK_SERVER_PRELOAD, "tests.support.helpers"]


def start_fork_server() -> None:
    """Start multiprocessing's fork server (one per process) with ``PRELOAD``, unless it runs.

    The trainer's ``spawn`` forks its ranks from the same server and sets its own preload list,
    which only counts if it starts the server: started here first with that list and the helpers (tests/conftest.py, at the
    session's start), every rank a test spawns starts with torch's compiler stack imported, and
    costs a fork instead of ~2-3 s of imports. The server's environment is the session's at its
    start (not a test's monkeypatched one); tests/support/warm_process.py passes the caller's own."""
    import multiprocessing.forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods():  # Windows: the trainer spawns
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def _child(fn: Callable[..., Any], args: tuple, environ: dict[str, str], cwd: str, out_path: str = os.devnull,
           err_path: str = os.devnull) -> None:
    os.setsid()  # its own session: a timeout kills the whole tree (ranks, their fork server)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if path != os.devnull else 0), 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    fn(*args)


def run_in_warm_process(fn: Callable[..., Any], args: tuple = (), *, timeout: float, cwd: str,
                        description: list[str] | None = None) -> subprocess.CompletedProcess:
    """``fn(*args)`` (a module-level function, pickled by reference) in a process of its own, as
    ``subprocess.run(..., capture_output=True, text=True, timeout=timeout, cwd=cwd)`` runs a script:
    returns a ``CompletedProcess`` (``args`` is ``description``), raises ``subprocess.TimeoutExpired``
    after killing its session when it runs past ``timeout``."""
    context = multiprocessing.get_context("forkserver")
    start_fork_server()
    with tempfile.TemporaryDirectory(prefix="warm-process-") as scratch:
        out_path, err_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        process = context.Process(target=_child, args=(fn, args, dict(os.environ), str(cwd), out_path, err_path))
        process.start()
        process.join(timeout)
        timed_out = process.exitcode is None
        if timed_out:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.join(30)
        else:  # what it started (its ranks' fork server) ends with it; anything else left: stop it
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        with open(out_path, errors="replace") as out, open(err_path, errors="replace") as err:
            stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(description or repr(fn), timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(description or repr(fn), process.exitcode, stdout, stderr)


def start_in_warm_process(fn: Callable[..., Any], args: tuple = (), *, cwd: str) -> multiprocessing.Process:
    """``fn(*args)`` started in a warm process of its own (as ``subprocess.Popen`` with its output to
    ``DEVNULL``); the caller kills or joins the returned process."""
    start_fork_server()
    process = multiprocessing.get_context("forkserver").Process(target=_child, args=(fn, args, dict(os.environ), str(cwd)))
    process.start()
    return process
