"""The pieces of sweeps and cluster launches that need no process: Hydra's sweep syntax as Optuna
distributions and back, the objective a run returns, the sweeper's and the submitit launchers' settings
(each bad one a `SettingError` naming its key)."""

from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from trainer.cli.errors import SettingError
from trainer.cli.objective import check_objective, objective_value
from trainer.cli.search_space import as_override, split_overrides

optuna = pytest.importorskip("optuna")
D = optuna.distributions


def _space(*overrides: str):
    return split_overrides(OverridesParser.create().parse_overrides(list(overrides)), "the command line's")


def test_sweep_syntax_becomes_optuna_distributions():
    fixed, space = _space("optimizer.lr=tag(log,interval(0.0001,0.1))", "data.batch_size=choice(16,32)",
                          "module.hidden=16,32,64", "trainer.max_steps=range(100,400,100)",
                          "model.depth=tag(int,interval(2,8))", "trainer.seed=3", "+data.extra=x")
    assert fixed == ["trainer.seed=3", "+data.extra=x"]
    assert space["optimizer.lr"] == D.FloatDistribution(0.0001, 0.1, log=True)
    assert space["data.batch_size"] == D.CategoricalDistribution([16, 32])
    assert space["module.hidden"] == D.CategoricalDistribution([16, 32, 64])
    assert space["trainer.max_steps"] == D.IntDistribution(100, 300, step=100)  # range's stop is left out
    assert space["model.depth"] == D.IntDistribution(2, 8)


@pytest.mark.parametrize("override, message", [
    ("optimizer.lr=interval(0.5,0.1)", "interval(0.5,0.1) needs finite ends, the first below the second"),
    ("optimizer.lr=tag(log,interval(0,0.1))", "needs ends above 0"),
    ("optimizer.lr=tag(cubic,interval(0.1,0.5))", "unknown tag(s) cubic"),
    ("data.batch_size=tag(log,choice(16,32))", "tags (log) apply to interval() only"),
    ("trainer.max_steps=range(5,5)", "holds no value"),
    ("data.batch_size=choice([1,2],[3])", "Optuna chooses among numbers, strings, booleans and null"),
])
def test_a_search_space_that_cannot_work_names_its_key(override, message):
    with pytest.raises(SettingError, match=r"the command line's " + override.split("=")[0] + ".*" + _escape(message)):
        _space(override)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize("value", [0.001, 16, True, None, "adamw", "a b", "it's"])
def test_a_trial_value_goes_back_as_an_override_hydra_reads_as_that_value(value):
    parsed = OverridesParser.create().parse_overrides([as_override("key", value)])[0]
    assert parsed.value() == value and type(parsed.value()) is type(value)


def test_the_objective_is_the_metric_s_last_value_or_every_metric():
    metrics = {"val/loss": 0.25, "train/loss": 0.5}
    assert objective_value({"objective": {"metric": None}}, metrics) is metrics
    assert objective_value({}, metrics) is metrics
    assert objective_value({"objective": {"metric": "val/loss"}}, metrics) == 0.25
    with pytest.raises(ValueError, match=r"objective.metric=val/los: the run logged no such metric; it logged "
                                         r"train/loss, val/loss"):
        objective_value({"objective": {"metric": "val/los"}}, metrics)


@pytest.mark.parametrize("objective, message", [
    ({"metric": "val/loss", "mode": "min"}, "objective.mode is not an objective setting; the settings are metric"),
    ({"metric": 3}, "objective.metric=3 must be the name of a logged metric"),
    ("val/loss", "objective='val/loss' must be a node with metric:"),
])
def test_a_bad_objective_is_refused_before_anything_is_built(objective, message):
    with pytest.raises(ValueError, match=_escape(message)):
        check_objective({"objective": objective})


@pytest.mark.parametrize("settings, message", [
    ({"direction": "up"}, "hydra.sweeper.direction='up': the direction is one of minimize, maximize"),
    ({"direction": ["minimize", "maximize"]}, "hydra.sweeper.direction=['minimize', 'maximize']"),
    ({"n_trials": 0}, "hydra.sweeper.n_trials=0 must be an integer of 1 or more"),
    ({"n_jobs": 1.5}, "hydra.sweeper.n_jobs=1.5 must be an integer of 1 or more"),
    ({"max_failure_rate": 0.5}, "hydra.sweeper.max_failure_rate is not a setting of the optuna sweeper"),
    ({"storage": 3}, "hydra.sweeper.storage=3 must be a string or null"),
    ({"params": "lr"}, "hydra.sweeper.params must map keys to search spaces"),
])
def test_a_bad_sweeper_setting_names_its_key(settings, message):
    from trainer.cli.optuna_sweeper import OptunaTrialSweeper

    with pytest.raises(SettingError, match=_escape(message)):
        OptunaTrialSweeper(**settings)


LOCAL = {"timeout_min": 60, "tasks_per_node": 1, "nodes": 1, "gpus_per_node": None}
SLURM = {**LOCAL, "signal_delay_s": 120, "max_num_timeout": 0}


@pytest.mark.parametrize("kind, changes, devices, num_nodes, message", [
    ("local", {"tasks_per_node": 3}, 2, 1, "hydra.launcher.tasks_per_node=3: each task of a job is a rank"),
    ("local", {"timeout_min": 0}, 2, 1, "hydra.launcher.timeout_min=0 must be an integer of 1 or more (minutes)"),
    ("slurm", {"nodes": 2, "tasks_per_node": 1}, 2, 2, "hydra.launcher.nodes=2: a job on several nodes"),
    ("slurm", {"nodes": 2, "tasks_per_node": 2}, 2, 1, "hydra.launcher.nodes=2: a job on several nodes"),
    ("slurm", {}, 2, 2, "trainer.num_nodes=2 but hydra.launcher.nodes=1"),
    ("slurm", {"gpus_per_node": 1, "tasks_per_node": 2}, 2, 1, "hydra.launcher.gpus_per_node=1 is fewer than"),
    ("slurm", {"signal_delay_s": 3600}, 1, 1, "hydra.launcher.signal_delay_s=3600: the signal to save comes"),
    ("slurm", {"max_num_timeout": 2}, 1, 1, "hydra.launcher.max_num_timeout=2: with checkpoint.save_on_signal=true"),
])
def test_a_launcher_setting_that_cannot_work_names_its_key(kind, changes, devices, num_nodes, message):
    from trainer.cli.launcher_check import check_settings

    with pytest.raises(SettingError, match=_escape(message)):
        check_settings(kind, {**(SLURM if kind == "slurm" else LOCAL), **changes}, devices, num_nodes)


@pytest.mark.parametrize("changes, devices, num_nodes", [
    ({}, 2, 1),  # one task; the trainer spawns 2 ranks
    ({"tasks_per_node": 2}, 2, 1),  # a task per rank
    ({"tasks_per_node": 4, "nodes": 2, "gpus_per_node": 4}, 4, 2),  # several nodes, a task per GPU
    ({"tasks_per_node": 3}, "auto", 1),  # the trainer checks the processes it finds
])
def test_launcher_settings_that_work_pass(changes, devices, num_nodes):
    from trainer.cli.launcher_check import check_settings

    check_settings("slurm", {**SLURM, **changes}, devices, num_nodes)


def test_submitit_launcher_keys_are_the_plugin_s():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from trainer.cli.launcher_check import check_launcher_keys

    check_launcher_keys("slurm", {"partition": "gpu", "signal_delay_s": 60})
    with pytest.raises(SettingError, match=r"hydra.launcher.partition is not a setting of hydra/launcher=submitit_local"):
        check_launcher_keys("local", {"partition": "gpu"})
