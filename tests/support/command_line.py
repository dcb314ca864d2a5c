"""Running ``train.py`` (and torchrun) as a user does, from the tests: a subprocess per run with a
timeout, its process group killed on timeout, and a marker in its environment that finds any
process it left behind (``_kill_unfinished``, an autouse fixture where imported).

``python train.py ...`` runs warm (tests/support/warm_commands.py): its process is forked from a server
that imported torch and the trainer once, and otherwise runs as the fresh interpreter would (its
arguments, directory, environment, output, exit status); its ranks come from a fork server of its own,
started in its session as a fresh run's are. Processes it left behind are found by the marker (what
the run started with ``exec``: its fork server, its ranks) and by its session (what it forked).
``torchrun`` and any other command start as fresh interpreters."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.support.helpers import REPO, read_metrics, train_losses

TIMEOUT_S = 120  # per subprocess
FAST = [
    "recipe=mlp",
    "trainer.max_steps=6",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=null",
    "trainer.progress_bar=false",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = [sys.executable, "train.py"]
# Variables that would make a run think a launcher started it (e.g. pytest itself under srun).
_LAUNCHER_VARS = re.compile(r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|"
                            r"TORCHELASTIC_.*|SLURM_.*|TRAINER_SPAWNED|HYDRA_FULL_ERROR)")
_MARKER = "TRAINER_LAUNCH_TEST_MARKER"


# ----- running subprocesses -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session(pid: str) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[4])  # after "pid (comm)": state ppid pgrp session


def processes_with_marker(marker: str, session: int | None = None) -> list[str]:
    """``pid: command line`` of every live process whose environment carries ``marker`` (or, where
    ``session`` is given, that runs in that session)."""
    needle = f"{_MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0") and not (session and _session(entry) == session):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {command[:200]}")
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    leftovers: list[str] = field(default_factory=list)  # processes still alive after it ended

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        return (f"$ {' '.join(self.args)}\nexit {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}")


_UNFINISHED: set[Started] = set()


class Started:
    """A subprocess in its own session (so a timeout can kill all of it), tagged with a marker."""

    def __init__(self, args: list[str], cwd: str | Path = REPO):
        self.args = [str(a) for a in args]
        self.marker = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not _LAUNCHER_VARS.fullmatch(k)}
        env[_MARKER] = self.marker
        run_args, self._pid_file = self.args, None
        if self.args[:2] == TRAIN and Path(cwd, "train.py").is_file():
            from tests.support.warm_commands import session_server

            self._pid_file = Path(tempfile.mkdtemp(prefix="warm-command-")) / "pid"
            env.update(WARM_COMMAND_PID_FILE=str(self._pid_file), WARM_COMMAND_FORK_SERVER="own")
            run_args = session_server().client_args(self.args)
        self.start = time.monotonic()
        self.process = subprocess.Popen(run_args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
        _UNFINISHED.add(self)

    def _left_behind(self) -> list[str]:
        session = None
        if self._pid_file is not None and self._pid_file.is_file():
            session = int(self._pid_file.read_text())  # the warm command's own session
        return processes_with_marker(self.marker, session)

    def finish(self, timeout: float = TIMEOUT_S) -> Result:
        _UNFINISHED.discard(self)
        try:
            stdout, stderr = self.process.communicate(timeout=max(1.0, timeout - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            self.kill_all()
            stdout, stderr = self.process.communicate(timeout=30)
            pytest.fail(f"timed out after {timeout} s: {' '.join(self.args)}\n--- stdout\n{stdout[-3000:]}\n"
                        f"--- stderr\n{stderr[-6000:]}")
        seconds = time.monotonic() - self.start
        # Helpers such as multiprocessing's resource tracker end a moment after their parent.
        deadline = time.monotonic() + 5
        while (leftovers := self._left_behind()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill_all()  # do not leave them to the next test
        if self._pid_file is not None:
            shutil.rmtree(self._pid_file.parent, ignore_errors=True)
        return Result(self.args, self.process.returncode, stdout, stderr, seconds, leftovers)

    def kill_all(self) -> None:
        """SIGKILL what is left of this run: its session (while it is not yet reaped), and every
        process with its marker (torchrun starts each worker in a session of its own)."""
        if self.process.returncode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
        for _ in range(20):
            found = self._left_behind()
            if not found:
                return
            for line in found:
                try:
                    os.kill(int(line.split(":")[0]), signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)


@pytest.fixture(autouse=True)
def _kill_unfinished():
    """A test that failed half-way (e.g. one of two nodes timed out) leaves nothing running."""
    yield
    while _UNFINISHED:
        started = _UNFINISHED.pop()
        started.kill_all()
        started.process.communicate()


def run(args: list[str], timeout: float = TIMEOUT_S) -> Result:
    return Started(args).finish(timeout)


def torchrun(nproc: int = 2) -> list[str]:
    return TORCHRUN + ["--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def assert_ok(result: Result) -> None:
    assert result.returncode == 0, result.describe()
    assert not result.leftovers, f"processes left behind: {result.leftovers}\n{result.describe()}"


def assert_six_steps(run_dir: Path) -> list[float]:
    assert (run_dir / "metrics.jsonl").is_file(), f"no metrics.jsonl in {run_dir}: {sorted(os.listdir(run_dir))}"
    losses = train_losses(str(run_dir))
    steps = [r["step"] for r in read_metrics(str(run_dir)) if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6], f"{run_dir}: train steps {steps}"
    return losses


def assert_same_losses(a: list[float], b: list[float], rtol: float) -> None:
    torch.testing.assert_close(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                               rtol=rtol, atol=0.0)
