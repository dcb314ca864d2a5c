"""The launcher's watch over spawned workers (trainer/runtime/supervision.py), with plain functions as the
workers (no training, no process group): a worker that stops is named and every worker is killed as
soon as its silence passes the timeout, while no collective has failed yet; workers that are busy (in
Python or asleep) for longer than the timeout are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from trainer.runtime.launch import WorkerFailed, spawn

pytestmark = pytest.mark.timeout(120)


def _stop_one(pid_dir: str, first_beat: bool) -> str:
    rank = int(os.environ["RANK"])
    with open(os.path.join(pid_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        if first_beat:
            time.sleep(1.0)  # (beats every 0.2 s)
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)  # rank 0: busy (beating) and in no collective, so nothing else would end the job
    return "finished"


def _busy(seconds: float) -> str:
    time.sleep(seconds / 2)
    deadline = time.monotonic() + seconds / 2
    while time.monotonic() < deadline:
        sum(range(1000))
    return f"rank {os.environ['RANK']} done"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("first_beat", [True, False], ids=["after its first beat", "at once"])
def test_a_stopped_worker_is_named_and_every_worker_killed(tmp_path, first_beat):
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as raised:
        spawn(_stop_one, (str(tmp_path), first_beat), nprocs=2, timeout=timedelta(seconds=2))
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith("rank 1 (pid ") and "(stopped) stopped responding: no heartbeat for" in message, message
    assert "trainer.collective_timeout_s=2" in message and "every rank was stopped" in message, message
    assert "\n" not in message
    assert elapsed < 30, elapsed  # not rank 0's 60 s
    pids = [int((tmp_path / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert not [pid for pid in pids if _alive(pid)], pids


def test_workers_busy_for_longer_than_the_timeout_are_left_alone():
    assert spawn(_busy, (3.0,), nprocs=2, timeout=timedelta(seconds=1)) == "rank 0 done"



CRASHING_RANK = """
import os, sys, time
from datetime import timedelta
from trainer.runtime.launch import WorkerFailed, spawn

def crash_in_native_code():
    if os.environ["RANK"] == "1":
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV in C, below any Python exception
    time.sleep(60)

if __name__ == "__main__":
    try:
        spawn(crash_in_native_code, (), nprocs=2, timeout=timedelta(seconds=30))
    except WorkerFailed as error:
        sys.exit(f"WorkerFailed: {error}")
"""


def test_a_rank_that_crashes_in_native_code_is_named_with_its_python_stack(tmp_path):
    # A script of its own: the ranks' stderr is the launching process's, which pytest's capture does not reach
    # when the warm fork server was started before the test.
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_RANK)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "WorkerFailed: rank 1 (pid " in done.stderr and "killed by SIGSEGV" in done.stderr, done.stderr[-2000:]
    # the crashed rank's own stack, printed as it died: where in the program it was
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr[-2000:]
    assert "in crash_in_native_code" in done.stderr, done.stderr[-2000:]
