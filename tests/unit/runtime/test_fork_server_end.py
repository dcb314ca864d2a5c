"""How the launcher tells that the fork server ended (trainer/runtime/supervision.py ``fork_server_end``):
the words of its end, read without reaping it (multiprocessing reaps it at its next start of a process)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from trainer.runtime.supervision import fork_server_end

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.waitid with WNOWAIT: Linux")


def test_a_running_child_has_not_ended():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert fork_server_end(child.pid, wait_s=0.1) is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("code, words", [(3, "exited with code 3"), (-signal.SIGKILL, "was killed by SIGKILL")])
def test_the_end_is_told_and_the_child_left_to_its_owner(code, words):
    program = f"import os, signal; os.kill(os.getpid(), {-code})" if code < 0 else f"raise SystemExit({code})"
    child = subprocess.Popen([sys.executable, "-c", program])
    assert fork_server_end(child.pid, wait_s=30) == words
    assert child.wait(timeout=5) == code  # not reaped by fork_server_end: its owner still reads its status


def test_no_pid_or_not_a_child_is_not_told():
    assert fork_server_end(None) is None
    assert fork_server_end(1) is None  # init: not this process's child
