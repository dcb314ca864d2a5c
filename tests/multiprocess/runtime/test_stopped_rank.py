"""A rank that stops responding without dying (SIGSTOP) ends the job within the collective timeout plus a
grace period, one line names it, and no process of the job is left; a rank that is merely slow is not
touched; one alive but deadlocked is caught by the collective timeout, on the rank that waited, and the
launcher says no rank had stopped. Under the trainer's own spawning and under torchrun. A killed fork
server (the one that started the ranks) is named as such, not as a rank, and its orphaned ranks are killed.

Each run is a subprocess in a session of its own (tests/support/command_line.py: a marker in its
environment finds any process it left behind); the ranks also write their pids, checked one by one.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from tests.support.command_line import TORCHRUN, Started, _kill_unfinished, free_port  # noqa: F401 (_kill_unfinished: a fixture)
from tests.support.helpers import REPO, Regressor, read_metrics, run_trainer

pytestmark = pytest.mark.timeout(240)

TIMEOUT_S = 10  # trainer.collective_timeout_s of the stopped runs
GRACE_S = 15  # what ending the job may take beyond it: a beat interval, the kill, the launcher's exit (slow on a loaded machine)

STOPPING_SCRIPT = """
    import os
    import signal
    import sys
    import time

    sys.path.insert(0, {repo!r})

    import torch.distributed as dist

    from tests.support.helpers import Regressor
    from trainer import Trainer

    RUN_DIR = {run_dir!r}


    class StoppingRegressor(Regressor):
        # Rank 1 stops itself (SIGSTOP: every thread of it, the heartbeat's too) in its third step;
        # or hangs there, or kills its parent, the fork server that started the ranks.
        def training_step(self, batch, batch_idx):
            rank = dist.get_rank()
            if batch_idx == 0:
                with open(os.path.join(RUN_DIR, f"pid{{rank}}"), "w") as f:
                    f.write(str(os.getpid()))
            if rank == 1 and batch_idx == 2:
                with open(os.path.join(RUN_DIR, "stopped_at"), "w") as f:
                    f.write(repr(time.time()))
                if {action!r} == "hang":  # alive and beating, but never back (a deadlock)
                    time.sleep(3600)
                if {action!r} == "kill_fork_server":  # the ranks go on, orphans
                    with open(os.path.join(RUN_DIR, "fork_server_pid"), "w") as f:
                        f.write(str(os.getppid()))
                    os.kill(os.getppid(), signal.SIGKILL)
                else:
                    os.kill(os.getpid(), signal.SIGSTOP)
            return super().training_step(batch, batch_idx)


    if __name__ == "__main__":
        os.makedirs(RUN_DIR, exist_ok=True)
        Trainer(strategy="ddp", devices=2, max_steps=50, batch_size=8, log_every_n_steps=1, loggers=["jsonl"],
                progress_bar=False, collective_timeout_s={timeout}, run_dir=RUN_DIR).fit(StoppingRegressor())
"""


def _alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run_stopping(tmp_path, launcher: list[str], action: str = "stop"):
    run_dir = tmp_path / "run"
    script = tmp_path / "stopping.py"
    script.write_text(textwrap.dedent(STOPPING_SCRIPT.format(repo=REPO, run_dir=str(run_dir), timeout=TIMEOUT_S,
                                                             action=action)))
    started = Started(launcher + [str(script)])
    result = started.finish(timeout=180)
    ended = time.time()
    stopped_at = float((run_dir / "stopped_at").read_text())
    pids = [int((run_dir / f"pid{rank}").read_text()) for rank in (0, 1)]
    return result, ended - stopped_at, pids


def _assert_named_and_gone(result, elapsed: float, pids: list[int]) -> None:
    assert result.returncode != 0, result.describe()
    named = [line for line in result.output.splitlines() if "rank 1" in line and "stopped responding" in line]
    assert named, f"no line names rank 1 as the rank that stopped responding\n{result.describe()}"
    assert elapsed < TIMEOUT_S + GRACE_S, f"the job ended {elapsed:.1f} s after rank 1 stopped\n{result.describe()}"
    assert not [pid for pid in pids if _alive(pid)], f"ranks left running: {pids}\n{result.describe()}"
    assert not result.leftovers, f"processes left behind: {result.leftovers}\n{result.describe()}"


def test_a_stopped_spawned_rank_is_named_and_the_job_ends(tmp_path):
    result, elapsed, pids = _run_stopping(tmp_path, [sys.executable])
    _assert_named_and_gone(result, elapsed, pids)
    assert "WorkerFailed: rank 1" in result.stderr, result.describe()  # the launcher's error is about rank 1


def test_a_stopped_torchrun_rank_is_named_and_the_job_ends(tmp_path):
    launcher = TORCHRUN + ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    result, elapsed, pids = _run_stopping(tmp_path, launcher)
    _assert_named_and_gone(result, elapsed, pids)


def test_a_deadlocked_rank_is_caught_by_the_collective_timeout(tmp_path):
    # Rank 1 is alive (its heartbeat goes on) but never comes back: rank 0's collective times out,
    # and the launcher says that no rank had stopped responding.
    result, elapsed, pids = _run_stopping(tmp_path, [sys.executable], action="hang")
    assert result.returncode != 0, result.describe()
    line = next((line for line in result.stderr.splitlines() if line.startswith("trainer.runtime")), "")
    assert "rank 0 failed" in line and "no rank had stopped responding" in line, result.describe()
    assert elapsed < TIMEOUT_S + GRACE_S, f"the job ended {elapsed:.1f} s after rank 1 hung\n{result.describe()}"
    assert not [pid for pid in pids if _alive(pid)], f"ranks left running: {pids}\n{result.describe()}"
    assert not result.leftovers, f"processes left behind: {result.leftovers}\n{result.describe()}"


class SlowRanks(Regressor):
    """Both ranks spend longer than the collective timeout in a hook (no collective waits meanwhile)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_step_end(self, step, metrics):
        if step == 2:
            time.sleep(self.seconds / 2)
            deadline = time.monotonic() + self.seconds / 2
            while time.monotonic() < deadline:  # busy in Python too, not only asleep
                sum(range(1000))


def test_slow_ranks_are_not_taken_for_stopped_ones(tmp_path):
    # Silent for 1.5 collective timeouts if the beat came from the main thread: the heartbeat's own
    # thread keeps beating, so the run completes.
    run_trainer(tmp_path, SlowRanks(seconds=7.0), strategy="ddp", devices=2, max_steps=4, collective_timeout_s=5)
    assert [r["step"] for r in read_metrics(str(tmp_path)) if "train/loss" in r] == [1, 2, 3, 4]
    assert os.path.isfile(os.path.join(str(tmp_path), "params.pt"))


def test_a_dead_fork_server_is_named_and_the_job_ends(tmp_path):
    # The fork server that started the ranks is killed mid-run: the launcher can no longer read any
    # rank's exit status (multiprocessing calls each one's "exit code 255"), and the ranks go on as
    # orphans. The error names the server, not a rank, and no rank is left running.
    result, elapsed, pids = _run_stopping(tmp_path, [sys.executable], action="kill_fork_server")
    server = int((tmp_path / "run" / "fork_server_pid").read_text())
    assert result.returncode != 0, result.describe()
    expected = f"WorkerFailed: the fork server that starts the ranks (pid {server}) was killed by SIGKILL"
    assert expected in result.stderr, result.describe()
    assert "exited with code 255" not in result.output, result.describe()
    assert elapsed < GRACE_S, f"the job ended {elapsed:.1f} s after the fork server was killed\n{result.describe()}"
    assert not [pid for pid in pids if _alive(pid)], f"ranks left running: {pids}\n{result.describe()}"
    assert not result.leftovers, f"processes left behind: {result.leftovers}\n{result.describe()}"
