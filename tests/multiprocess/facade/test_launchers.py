"""Hydra's submitit launcher (hydra/launcher=submitit_local, the same code path as submitit_slurm on one
machine) runs multi-process jobs that train as they do without it: a job whose trainer spawns its ranks,
and a job whose tasks are the ranks (tasks_per_node = trainer.devices). Same global batch and seed, so
the losses agree to 1e-6 (CPU fp32, the same reductions in the same order). A bad launcher setting ends
the command with one line naming the key before any job starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.command_line import FAST, TRAIN, assert_ok, assert_same_losses, assert_six_steps, run

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")  # the slurm extra (meshtrainer[slurm])

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DDP = ["strategy=ddp", "trainer.devices=2", "logger=[jsonl]", "checkpoint.save_last=false"]


def _job_output(sweep_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*_log.*")))


def test_two_jobs_each_spawning_two_ranks_train_as_without_the_launcher(tmp_path):
    plain = run(TRAIN + ["-m", *FAST, *DDP, "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path / 'plain'}"])
    assert_ok(plain)
    launched = run(TRAIN + ["-m", "hydra/launcher=submitit_local", *FAST, *DDP, "trainer.seed=1,2",
                            f"hydra.sweep.dir={tmp_path / 'submitit'}"], timeout=500)
    assert_ok(launched)
    assert _job_output(tmp_path / "submitit").count("strategy ddp, world size 2") == 2
    for job in ("0", "1"):
        assert_same_losses(assert_six_steps(tmp_path / "submitit" / job), assert_six_steps(tmp_path / "plain" / job),
                           rtol=1e-6)
    # the two seeds are two different runs
    assert assert_six_steps(tmp_path / "submitit" / "0") != assert_six_steps(tmp_path / "submitit" / "1")


def test_a_job_whose_tasks_are_the_ranks_trains_as_without_the_launcher(tmp_path):
    plain = run(TRAIN + [*FAST, *DDP, f"hydra.run.dir={tmp_path / 'plain'}"])
    assert_ok(plain)
    launched = run(TRAIN + ["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *FAST, *DDP,
                            f"hydra.sweep.dir={tmp_path / 'submitit'}"], timeout=500)
    assert_ok(launched)
    output = _job_output(tmp_path / "submitit")
    assert output.count("strategy ddp, world size 2") == 1, output  # rank 0 reports, one run
    assert_same_losses(assert_six_steps(tmp_path / "submitit" / "0"), assert_six_steps(tmp_path / "plain"), rtol=1e-6)


BAD = {
    "tasks": (["hydra.launcher.tasks_per_node=3"],
              "error: hydra.launcher.tasks_per_node=3: each task of a job is a rank, so it is 1 (the trainer starts "
              "trainer.devices=2 ranks itself) or trainer.devices=2"),
    "nodes": (["hydra.launcher.nodes=2"], "error: hydra.launcher.nodes=2: a job on several nodes starts every rank"),
    "time": (["hydra.launcher.timeout_min=0"], "error: hydra.launcher.timeout_min=0 must be"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_launcher_setting_is_one_line_before_any_job(name, tmp_path):
    overrides, expected = BAD[name]
    result = run(TRAIN + ["-m", "hydra/launcher=submitit_local", *FAST, *DDP, *overrides,
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], timeout=120)
    assert result.returncode == 1, result.describe()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.describe()
    assert not (tmp_path / "sweep" / ".submitit").exists(), result.describe()


def test_a_job_s_config_error_reaches_the_submitting_command_in_one_line(tmp_path):
    result = run(TRAIN + ["-m", "hydra/launcher=submitit_local", *FAST, "logger=[jsonl]", "data.batch_size=-4",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], timeout=300)
    assert result.returncode == 1, result.describe()
    assert "Traceback" not in result.output, result.describe()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: data.batch_size must be an integer >= 1, got -4 (or null: the train loader's)"], \
        result.describe()
