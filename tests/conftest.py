"""The suite's shared set-up. ``tests`` is a package: shared helpers are ``tests.support.*`` (importable
by the trainer's workers, which get this process's ``sys.path``, where pytest put the repository root).
"""

import os

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _warm_fork_server():
    """One fork server for the session, started before any test spawns ranks, with torch, its
    compiler stack, the trainer and the helpers imported (tests/support/warm_process.py start_fork_server):
    each 2-rank run then starts in a fork, not in seconds of imports per rank."""
    from tests.support.warm_process import start_fork_server

    start_fork_server()


@pytest.fixture(autouse=True)
def _no_heartbeat_left_behind():
    """A test that starts this process's heartbeat (trainer/runtime/heartbeat.py) must stop it: a
    watch left running ends its process (the test session) when its store goes away."""
    yield
    from trainer.runtime import heartbeat

    if heartbeat.running():
        heartbeat.stop()
        pytest.fail("the test left this process's heartbeat running (a watch would end the test session)")


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests run where CUDA is available and are skipped (with the reason
    shown by ``-ra``) elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ----- which tests start processes, and what each costs ----------------------------------------------
# TRAINER_TEST_PROCESS_LOG=path: every test's count of processes started (subprocess.Popen and
# multiprocessing's Process.start, the trainer's own workers included; a running total) and its
# seconds (set-up, call and tear-down: a module fixture's run counts in the first test that uses it),
# one JSON line per test, written as each test ends (read it while the suite runs).
_started = [0]
_seconds: dict[str, float] = {}


#: variables of the caller's shell that change what a run prints or where it thinks it runs (a
#: launcher's rank variables, SLURM's job, Hydra's full tracebacks): the suite runs without them, so
#: every test, and every process it starts, sees the environment its assertions were written for.
_CALLER_VARIABLES = ("HYDRA_FULL_ERROR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TRAINER_SPAWNED")


def pytest_configure(config):
    for name in _CALLER_VARIABLES:
        os.environ.pop(name, None)
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        os.environ.pop(name)
    if not os.environ.get("TRAINER_TEST_PROCESS_LOG"):
        return
    import multiprocessing.process
    import subprocess

    popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start

    def counted_popen(self, *args, **kwargs):
        _started[0] += 1
        return popen_init(self, *args, **kwargs)

    def counted_start(self):
        _started[0] += 1
        return process_start(self)

    subprocess.Popen.__init__ = counted_popen
    multiprocessing.process.BaseProcess.start = counted_start


def pytest_runtest_logreport(report):
    if os.environ.get("TRAINER_TEST_PROCESS_LOG"):
        _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_runtest_logfinish(nodeid, location):
    path = os.environ.get("TRAINER_TEST_PROCESS_LOG")
    if path:
        import json

        with open(path, "a") as f:
            f.write(json.dumps({"test": nodeid, "processes": _started[0],
                                "seconds": round(_seconds.pop(nodeid, 0.0), 2)}) + "\n")
