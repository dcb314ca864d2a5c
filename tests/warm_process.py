"""Run a test's function in a process of its own, forked from a warm server.

A test that kills or signals a run needs the run in another process (``python tests/run_fit.py
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

#: what the fork server imports before forking (if the trainer's spawn started it first, its own list)
PRELOAD = ["torch", "torch.distributed", "trainer", "trainer.loop", "trainer.trainer", "helpers"]


def _child(fn: Callable[..., Any], args: tuple, environ: dict[str, str], cwd: str, out_path: str,
           err_path: str) -> None:
    os.setsid()  # its own session: a timeout kills the whole tree (ranks, their fork server)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
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
    context.set_forkserver_preload(PRELOAD)  # no effect once the server runs
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
