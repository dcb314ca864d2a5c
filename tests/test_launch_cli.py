"""``train.py`` launched for real: torchrun vs self-spawn, multirun, two "nodes" on one machine,
the legacy launcher (bad input and a dead rank: test_launch_errors.py).

Every run is a subprocess (a few seconds each: the mlp recipe for 6 steps) with a timeout; its
process group is killed on timeout, and a marker in its environment finds any process it left
behind. Runs that several tests look at are module-scoped fixtures, so each is made once.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from helpers import REPO, read_metrics, train_losses
from rank_exit import assert_ranks_ended_cleanly

pytestmark = pytest.mark.timeout(300)

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


def processes_with_marker(marker: str) -> list[str]:
    """``pid: command line`` of every live process whose environment carries ``marker``."""
    needle = f"{_MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
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
        self.start = time.monotonic()
        self.process = subprocess.Popen(self.args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
        _UNFINISHED.add(self)

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
        while (leftovers := processes_with_marker(self.marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill_all()  # do not leave them to the next test
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
            found = processes_with_marker(self.marker)
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


# ----- 1. torchrun and self-spawn: same training, one run directory ------------------------------------
@pytest.fixture(scope="module")
def spawn_ddp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("launch") / "spawn"
    result = run(TRAIN + FAST + ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={run_dir}"])
    assert_ok(result)
    return run_dir, assert_six_steps(run_dir)


@pytest.fixture(scope="module")
def torchrun_ddp(tmp_path_factory):
    parent = tmp_path_factory.mktemp("launch") / "tr"
    # Microseconds in the name: ranks that each ran Hydra would each create their own directory.
    result = run(torchrun(2) + ["train.py"] + FAST + ["strategy=ddp", "trainer.devices=2",
                                                      f"hydra.run.dir={parent}/${{now:%H-%M-%S-%f}}"])
    return parent, result


def test_torchrun_makes_one_run_directory(torchrun_ddp):
    parent, result = torchrun_ddp
    assert_ok(result)
    assert_ranks_ended_cleanly(result.stderr)  # (the ranks end with sys.exit: no abort, group released)
    created = sorted(os.listdir(parent))
    assert len(created) == 1, f"expected one run directory under {parent}, got {created}"
    assert re.fullmatch(r"\d\d-\d\d-\d\d-\d{6}", created[0]), created
    run_dir = parent / created[0]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert_six_steps(run_dir)


def test_torchrun_equals_self_spawn(torchrun_ddp, spawn_ddp):
    parent, result = torchrun_ddp
    assert_ok(result)
    (run_dir,) = parent.iterdir()
    _, spawn_losses = spawn_ddp
    assert_same_losses(assert_six_steps(run_dir), spawn_losses, rtol=1e-6)


# ----- 2. multirun with devices=2 ----------------------------------------------------------------------
MULTIRUN = ["-m"] + FAST + ["strategy=single,ddp", "trainer.devices=2"]


def test_multirun_self_spawn(tmp_path, spawn_ddp):
    sweep = tmp_path / "sweep"
    assert_ok(run(TRAIN + MULTIRUN + [f"hydra.sweep.dir={sweep}"]))
    single, ddp = assert_six_steps(sweep / "0"), assert_six_steps(sweep / "1")
    assert "strategy=single" in (sweep / "0" / ".hydra" / "overrides.yaml").read_text()
    assert_same_losses(ddp, spawn_ddp[1], rtol=1e-6)  # the ddp job really ran on 2 ranks
    assert single != ddp  # and the single job on one (global batch 32, not 64)


@pytest.fixture(scope="module")
def torchrun_multirun(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("launch") / "sweep_tr"
    return sweep, run(torchrun(2) + ["train.py"] + MULTIRUN + [f"hydra.sweep.dir={sweep}"])


def test_multirun_under_torchrun_runs_every_job(torchrun_multirun, spawn_ddp):
    # Job 0 (strategy=single under torchrun) is refused (see the next test); that must not hang
    # the sweep or the other ranks (it used to: rank 1 died in job 0 while rank 0 went on), and job 1 must train.
    sweep, result = torchrun_multirun
    assert not result.leftovers, result.leftovers
    assert_same_losses(assert_six_steps(sweep / "1"), spawn_ddp[1], rtol=1e-6)


def test_multirun_under_torchrun_refuses_single_with_a_clear_error(torchrun_multirun):
    # Under torchrun the launcher already started 2 processes, so a one-process strategy cannot
    # use them: job 0 (strategy=single) must fail with a message naming both counts (self-spawn
    # instead runs it on one process with a warning, as nothing was started yet).
    sweep, result = torchrun_multirun
    assert result.returncode != 0
    assert "started 2 processes but trainer.devices=1" in result.output
    assert_six_steps(sweep / "1")


# ----- 3. two "nodes" on one machine -------------------------------------------------------------------
def test_two_nodes_on_one_machine(tmp_path):
    port = free_port()
    run_dir = tmp_path / "nodes"
    nodes = [
        Started(TORCHRUN + ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node), "--master_addr",
                            "127.0.0.1", "--master_port", str(port), "train.py"] + FAST
                + ["strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2", "data.batch_size=32",
                   f"hydra.run.dir={run_dir}"])
        for node in (0, 1)
    ]
    # One process with the same global batch (64), meanwhile: it only starts when a core is free.
    reference = Started(TRAIN + FAST + ["data.batch_size=64", f"hydra.run.dir={tmp_path / 'b64'}"])
    for node in nodes:
        assert_ok(node.finish())
    assert_ok(reference.finish())
    assert_same_losses(assert_six_steps(run_dir), assert_six_steps(tmp_path / "b64"), rtol=1e-5)


# ----- 4. the legacy launcher --------------------------------------------------------------------------
def test_legacy_launcher_local_rank_argument(tmp_path, spawn_ddp):
    # python -m torch.distributed.launch passes --local-rank=N to the script (no --use-env).
    run_dir = tmp_path / "legacy"
    result = run([sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node", "2", "--master_addr",
                  "127.0.0.1", "--master_port", str(free_port()), "train.py"] + FAST
                 + ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={run_dir}"])
    assert_ok(result)
    assert_same_losses(assert_six_steps(run_dir), spawn_ddp[1], rtol=1e-6)
