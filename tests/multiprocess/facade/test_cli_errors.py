"""Config errors under ``python train.py``: one line naming the value, non-zero exit, no traceback
(kept under ``HYDRA_FULL_ERROR=1``); errors raised while training keep theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.helpers import REPO
from tests.support.rank_exit import assert_ranks_ended_cleanly
from tests.support.command_line import FAST, TRAIN, assert_six_steps, run, torchrun

pytestmark = pytest.mark.timeout(240)

BAD = {
    "negative batch": (["data.batch_size=-4"], "error: data.batch_size must be an integer >= 1, got -4 (or null: the train loader's)"),
    "no devices": (["trainer.devices=0"], "error: trainer.devices must be an integer >= 1, got 0 (or 'auto')"),
    "bogus sharding": (["strategy=fsdp", "strategy.sharding=bogus", "trainer.devices=2"],
                       "error: strategy.sharding='bogus' is not one of full, grad_op, no_shard, hybrid"),
}


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_errors")

    def one(item):
        index, (name, (overrides, _)) = item
        return name, run(TRAIN + FAST + overrides + [f"hydra.run.dir={root / str(index)}"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, enumerate(BAD.items())))


@pytest.mark.parametrize("name", list(BAD))
def test_config_error_is_one_line_without_traceback(name, bad_runs):
    result = bad_runs[name]
    assert result.returncode == 1, result.describe()
    assert "Traceback" not in result.output, result.describe()
    assert result.stderr.strip().splitlines() == [BAD[name][1]], result.describe()


def test_full_error_keeps_the_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["HYDRA_FULL_ERROR"] = "1"
    result = subprocess.run(TRAIN + FAST + ["data.batch_size=-4", f"hydra.run.dir={tmp_path}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "data.batch_size must be an integer >= 1, got -4" in result.stderr


def test_error_while_training_keeps_its_traceback(tmp_path):
    # A ValueError raised by the loop after training started (the mlp module returns no num_tokens)
    # is not a config error: its traceback stays.
    result = run(TRAIN + FAST + ["trainer.loss_normalization=tokens", f"hydra.run.dir={tmp_path}"])
    assert result.returncode != 0, result.describe()
    assert "Traceback" in result.output and "needs training_step to return 'num_tokens'" in result.output


def test_config_error_under_torchrun_is_one_line_from_rank_zero(tmp_path):
    result = run(torchrun(2) + ["train.py"] + FAST + ["strategy=ddp", "trainer.devices=2", "data.batch_size=-4",
                                                      f"hydra.run.dir={tmp_path}"])
    assert result.returncode != 0, result.describe()
    # (torchrun's agent prints its own ChildFailedError traceback for any non-zero exit: not ours)
    assert f'File "{os.path.join(REPO, "trainer")}' not in result.output, result.describe()
    lines = [line for line in result.output.splitlines() if "data.batch_size" in line]
    assert lines == ["error: data.batch_size must be an integer >= 1, got -4 (or null: the train loader's)"], result.describe()
    assert not result.leftovers, result.leftovers
    assert_ranks_ended_cleanly(result.stderr)  # both ranks end the ordinary way (exit code 1 here)


def test_multirun_reports_the_bad_job_and_runs_the_others(tmp_path):
    result = run(TRAIN + ["-m"] + FAST + ["data.batch_size=-4,32", f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 1, result.describe()
    assert "Traceback" not in result.output, result.describe()
    assert "error: data.batch_size must be an integer >= 1, got -4 (or null: the train loader's)" in result.stderr, result.describe()
    assert_six_steps(tmp_path / "1")
