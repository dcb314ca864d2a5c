"""Warm ``trainer`` and ``python`` commands for the docs test: a command the docs run as a fresh process
(``trainer recipe=mlp ...``, ``python fit.py``) starts instead in a process forked from a server that
imported torch, its compiler stack, Hydra and the trainer once; and a 2-rank run forks its ranks from
the fork server that server started once, instead of starting one per command. Each command otherwise
runs as its fresh process would: its arguments, working directory, environment, stdin / stdout /
stderr, signals and exit status (tests/support/warm_command_server.py, warm_command_client.py).

What this leaves to other tests: a command's start-up itself (its imports, ``python -m trainer``
resolving the package) is the subject of tests/unit/facade/test_start_up_imports.py, the CLI tests
(``python train.py`` as a subprocess) and the wheel test.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
SERVER = SUPPORT / "warm_command_server.py"
CLIENT = SUPPORT / "warm_command_client.py"


class WarmCommandServer:
    """The server process and its socket; ``stop()`` ends it with everything it started."""

    def __init__(self, env: dict[str, str], start_timeout: float = 180.0):
        self._scratch = tempfile.TemporaryDirectory(prefix="warm-commands-")
        self.socket = os.path.join(self._scratch.name, "socket")
        self._log = open(os.path.join(self._scratch.name, "server.log"), "w+")
        self._errors = open(os.path.join(self._scratch.name, "server.err"), "w+")
        self.process = subprocess.Popen([sys.executable, str(SERVER), self.socket], env=env, stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=self._errors, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(self.socket):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._log.seek(0)
                self._errors.seek(0)
                log = self._log.read() + self._errors.read()
                self.stop()
                raise RuntimeError(f"the warm command server did not start:\n{log[-5000:]}")
            time.sleep(0.05)

    def command_line(self, program: str) -> str:
        """A shell line that runs ``program`` (``-m trainer``, or nothing for ``python``) with its
        arguments (``"$@"``) through the server."""
        return f'exec "{sys.executable}" -S -E "{CLIENT}" "{self.socket}" "{sys.executable}" {program} "$@"'

    def client_args(self, args: list[str]) -> list[str]:
        """The arguments that run ``args`` (``[sys.executable, ...]``) through the server."""
        return [sys.executable, "-S", "-E", str(CLIENT), self.socket, *args]

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the server, its fork server, any relay left
        except ProcessLookupError:
            pass
        self.process.wait()
        self._log.close()
        self._errors.close()
        self._scratch.cleanup()


_SESSION: list[WarmCommandServer] = []


def session_server() -> WarmCommandServer:
    """The test session's server, started on first use (with this checkout first on PYTHONPATH, as the
    docs' and CLI tests' commands have it), stopped when the session's interpreter exits."""
    if not _SESSION:
        from tests.support.helpers import REPO

        env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "HYDRA_FULL_ERROR", "WANDB_MODE")}
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        _SESSION.append(WarmCommandServer(env))
        atexit.register(_SESSION[0].stop)
    return _SESSION[0]
