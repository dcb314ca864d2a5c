"""Workers started from the fork server: the caller's environment and directory at each call, and a
signal meant for the job does not end the server (its death would look like every worker dying)."""

import json
import os
import signal

from tests.support.helpers import Regressor, run_trainer


class WhereAmI(Regressor):
    """Writes each rank's ``TRAINER_TEST_MARK`` and working directory; rank 0 can SIGTERM its parent
    process (the fork server) mid-run, as SLURM signals every process of a job step."""

    def __init__(self, signal_parent_at: int | None = None):
        super().__init__()
        self.signal_parent_at = signal_parent_at

    def on_train_step_end(self, step, metrics):
        rank = self.global_rank
        if step == self.signal_parent_at and rank == 0:
            os.kill(os.getppid(), signal.SIGTERM)

    def on_fit_end(self):
        super().on_fit_end()
        with open(os.path.join(self.trainer.run_dir, f"where{self.global_rank}.json"), "w") as f:
            json.dump({"mark": os.environ.get("TRAINER_TEST_MARK"), "cwd": os.getcwd(), "parent": os.getppid()}, f)


def _where(run_dir, rank):
    with open(os.path.join(str(run_dir), f"where{rank}.json")) as f:
        return json.load(f)


def test_workers_take_the_callers_environment_and_directory_at_each_call(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("TRAINER_TEST_MARK", "one")
    run_trainer(first, WhereAmI(), strategy="ddp", devices=2, max_steps=2)
    monkeypatch.setenv("TRAINER_TEST_MARK", "two")  # the fork server started with "one"
    monkeypatch.chdir(tmp_path)
    run_trainer(second, WhereAmI(), strategy="ddp", devices=2, max_steps=2)
    for rank in (0, 1):
        assert _where(first, rank)["mark"] == "one"
        assert _where(second, rank)["mark"] == "two"
        assert _where(second, rank)["cwd"] == str(tmp_path)
    # Both calls' workers came from one warm server (forked by it, not by this process).
    assert _where(first, 0)["parent"] == _where(second, 1)["parent"] != os.getpid()


def test_a_job_signal_to_the_fork_server_does_not_end_the_run(tmp_path):
    run_trainer(tmp_path, WhereAmI(signal_parent_at=2), strategy="ddp", devices=2, max_steps=4)
    assert _where(tmp_path, 0)["parent"] == _where(tmp_path, 1)["parent"]  # the server lived: both ranks finished
