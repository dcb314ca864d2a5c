"""Optuna sweeps through ``train.py -m hparams_search=mlp_optuna`` (the trainer's own Hydra sweeper,
hydra/sweeper=optuna): every trial is a complete run directory, Optuna's storage holds each trial's value,
and that value is the objective metric's last value in the trial's metrics.jsonl. A trial that cannot
start (an invalid value) or whose metric is not finite is told to Optuna as failed and the sweep goes on;
a bad sweeper setting ends the command with one line naming the key before any trial starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.command_line import TRAIN, assert_ok, run
from tests.support.helpers import read_metrics

optuna = pytest.importorskip("optuna")  # the sweep extra (meshtrainer[sweep])

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

# Few steps, two validations: each trial's objective (val/loss) is logged at step 4 and step 8.
SHORT = ["hparams_search=mlp_optuna", "trainer.max_steps=8", "trainer.val_every_n_steps=4", "trainer.log_every_n_steps=4",
         "trainer.progress_bar=false", "logger=[jsonl]", "checkpoint.save_last=false", "module.val_samples=64"]


def _last(run_dir: str | Path, metric: str) -> float:
    values = [row[metric] for row in read_metrics(str(run_dir)) if metric in row]
    assert values, f"{run_dir}: no {metric} in metrics.jsonl"
    return values[-1]


def _sweep(tmp_path: Path, *overrides: str, timeout: float = 500):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    result = run(TRAIN + ["-m", *SHORT, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                          f"hydra.sweeper.storage={storage}", *overrides], timeout=timeout)
    return result, storage


def _check_trials(tmp_path: Path, storage: str, completed: int, failed: int) -> dict:
    """Optuna's record of each trial against the trial's run directory; the best trial's value against its metrics."""
    study = optuna.load_study(study_name="mlp_optuna", storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == completed, states
    assert states.count(optuna.trial.TrialState.FAIL) == failed, states
    sweep_dir = tmp_path / "sweep"
    for trial in study.trials:  # job i is trial i: one study, started empty
        run_dir = sweep_dir / str(trial.number)
        assert (run_dir / ".hydra" / "config.yaml").is_file(), f"trial {trial.number}: no run directory"
        assert trial.user_attrs["run_dir"] == str(run_dir)  # kept with the trial in Optuna's storage
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert trial.value == _last(run_dir, "val/loss"), f"trial {trial.number}"
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best = min((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    assert results["best_trial"] == best.number and results["best_value"] == best.value
    assert results["best_value"] == _last(results["best_run_dir"], "val/loss")
    assert Path(results["best_run_dir"]) == sweep_dir / str(best.number)
    assert results["best_params"] == best.params and (results["trials"], results["failed"]) == (completed + failed, failed)
    return results


def test_sweep_of_four_trials_in_one_process(tmp_path):
    result, storage = _sweep(tmp_path, "hydra.sweeper.n_trials=4")
    assert_ok(result)
    results = _check_trials(tmp_path, storage, completed=4, failed=0)
    assert set(results["best_params"]) == {"optimizer.lr", "data.batch_size", "module.hidden"}
    assert "strategy single, world size 1" in result.output


def test_sweep_with_two_processes_per_trial(tmp_path):
    # Two parameters searched (the width is fixed on the command line, which wins over the example's space).
    result, storage = _sweep(tmp_path, "hydra.sweeper.n_trials=4", "module.hidden=32", "strategy=ddp",
                             "trainer.devices=2")
    assert_ok(result)
    results = _check_trials(tmp_path, storage, completed=4, failed=0)
    assert set(results["best_params"]) == {"optimizer.lr", "data.batch_size"}
    assert result.output.count("strategy ddp, world size 2") == 4, result.describe()


def test_a_trial_with_an_invalid_value_fails_and_the_sweep_goes_on(tmp_path):
    # Every pair once (the brute-force sampler): two trials get a negative learning rate, which the
    # optimizer refuses before training; the other two train.
    result, storage = _sweep(tmp_path, "hydra.sweeper.n_trials=4", "module.hidden=32",
                             "hydra.sweeper.sampler._target_=optuna.samplers.BruteForceSampler",
                             "optimizer.lr=choice(-1.0,0.05)", "data.batch_size=choice(16,32)")
    assert result.returncode == 1, result.describe()  # as any multirun with a failed job
    assert "Traceback" not in result.output, result.describe()
    refused = [line for line in result.stderr.splitlines() if line.startswith("error: ") and "lr=-1.0" in line]
    assert len(refused) == 2, result.describe()  # each failed trial's reason, in one line
    assert result.output.count("failed: the job could not start") == 2, result.describe()
    _check_trials(tmp_path, storage, completed=2, failed=2)


def test_a_diverged_trial_fails_and_the_sweep_goes_on(tmp_path):
    # An enormous learning rate makes the loss non-finite: the trial is failed, the other one counts.
    result, storage = _sweep(tmp_path, "hydra.sweeper.n_trials=2", "module.hidden=32", "data.batch_size=16",
                             "hydra.sweeper.sampler._target_=optuna.samplers.BruteForceSampler",
                             "optimizer.lr=choice(1e30,0.05)")
    assert "trial" in result.output and "failed" in result.output, result.describe()
    _check_trials(tmp_path, storage, completed=1, failed=1)


BAD_SETTINGS = {
    "direction": (["hydra.sweeper.direction=up"], "error: hydra.sweeper.direction='up': the direction is one of"),
    "n_trials": (["hydra.sweeper.n_trials=0"], "error: hydra.sweeper.n_trials=0 must be an integer of 1 or more"),
    "unknown key": (["+hydra.sweeper.n_trial=3"], "error: hydra.sweeper.n_trial is not a setting of the optuna sweeper"),
    "no objective": (["objective.metric=null"], "error: objective.metric=None: the optuna sweeper optimises one"),
    "sampler": (["hydra.sweeper.sampler._target_=optuna.samplers.TPESamplr"], "error: hydra.sweeper.sampler"),
    "search space": (["optimizer.lr=interval(0.5,0.1)"],
                     "error: the command line's optimizer.lr: interval(0.5,0.1) needs finite ends"),
}


@pytest.mark.parametrize("name", list(BAD_SETTINGS))
def test_a_bad_sweeper_setting_is_one_line_before_any_trial(name, tmp_path):
    overrides, expected = BAD_SETTINGS[name]
    result, _ = _sweep(tmp_path, *overrides, timeout=120)
    assert result.returncode == 1, result.describe()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.describe()
    assert "Launching" not in result.output and not (tmp_path / "sweep" / "0").exists(), result.describe()
