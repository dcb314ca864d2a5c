"""Loggers chosen through the ``logger=`` config group (Hydra and ``train.py``), on 2 ranks, and a W&B
run continued into a new run directory. Readers and the no-network fixture: test_loggers.py.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from tests.support.helpers import REPO, Regressor, fit, read_metrics
from tests.unit.loggers.test_loggers import (  # noqa: F401 (no_network_wandb: an autouse fixture)
    CONFIG_SECRET,
    CONFIG_WITH_SECRETS,
    ENV_SECRET,
    event_files,
    files_containing,
    no_network_wandb,
    offline_runs,
    read_csv,
    tensorboard_scalars,
    wandb_run,
)
from trainer.loggers.wandb_run_id import RUN_ID_FILE

pytestmark = pytest.mark.timeout(120)


# ----- the logger= config group ------------------------------------------------------------------------
def compose(overrides: list[str]) -> dict:
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        return OmegaConf.to_container(hydra_compose("config", overrides=overrides), resolve=True)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], ["jsonl", "tensorboard"]),
        (["logger=[tensorboard,wandb,csv]"], ["tensorboard", "wandb", "csv"]),
        (["logger=csv"], ["csv"]),
        (["logger=[]"], []),
    ],
    ids=["default", "three", "one", "none"],
)
def test_logger_group_selects_backends_with_their_options(overrides, expected, tmp_path):
    from trainer.cli.hydra_app import build

    config = compose(["recipe=mlp"] + overrides)
    built, _ = build(config, str(tmp_path))
    assert [name for name, _ in built.logger_specs] == expected
    for name, options in built.logger_specs:
        assert options == config["logger"][name]  # every option in the yaml reaches the backend


def test_logger_option_override_reaches_the_backend(tmp_path):
    from trainer.cli.hydra_app import build

    config = compose(["recipe=mlp", "logger=[jsonl,wandb]", "logger.wandb.project=demo", "logger.wandb.mode=offline"])
    built, _ = build(config, str(tmp_path))
    assert dict(built.logger_specs)["wandb"]["project"] == "demo" and dict(built.logger_specs)["wandb"]["mode"] == "offline"
    assert "loggers" not in config["trainer"]  # the choice lives in the logger group only


# ----- whole runs --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_rank_run_makes_one_wandb_run_and_one_event_file(tmp_path):
    loggers = ["jsonl", "csv", "tensorboard", {"wandb": {"project": "two-ranks"}}]
    fit(tmp_path, strategy="ddp", devices=2, max_steps=4, val_every_n_steps=2, loggers=loggers,
        module=Regressor(val_samples=32), config=CONFIG_WITH_SECRETS)

    steps = [record["step"] for record in read_metrics(tmp_path) if "train/loss" in record]
    assert steps == [1, 2, 3, 4]
    assert len(event_files(tmp_path)) == 1
    assert [s for s, _ in tensorboard_scalars(tmp_path)["train/loss"]] == steps
    assert [s for s, _ in tensorboard_scalars(tmp_path)["val/loss"]] == [2, 4]
    _, rows = read_csv(tmp_path / "metrics.csv")
    assert [int(row["step"]) for row in rows] == steps and rows[1]["val/loss"] != ""

    (run,) = offline_runs(tmp_path)
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    recorded_id, config, history = wandb_run(os.path.join(run, f"run-{run_id}.wandb"))
    assert recorded_id == run_id and config["wandb"]["api_key"] == "***"
    assert sorted({step for step, values in history if "train/loss" in values}) == steps
    assert files_containing(tmp_path, [CONFIG_SECRET, ENV_SECRET]) == []


@pytest.mark.slow
def test_train_py_with_three_loggers_and_no_api_key(tmp_path):
    """The user's command: ``python train.py logger=[tensorboard,wandb,csv]``; W&B goes offline by
    itself (no API key, no ``WANDB_MODE``)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    args = [sys.executable, "train.py", "recipe=mlp", "logger=[tensorboard,wandb,csv]", "trainer.max_steps=3",
            "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null", "trainer.progress_bar=false",
            f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr[-4000:]

    assert not (tmp_path / "metrics.jsonl").exists()  # jsonl was not selected
    assert [s for s, _ in tensorboard_scalars(tmp_path)["train/loss"]] == [1, 2, 3]
    assert [row["step"] for row in read_csv(tmp_path / "metrics.csv")[1]] == ["1", "2", "3"]
    (run,) = offline_runs(tmp_path)
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    recorded_id, config, history = wandb_run(os.path.join(run, f"run-{run_id}.wandb"))
    assert recorded_id == run_id
    assert config["logger"]["wandb"]["mode"] == "auto" and config["trainer"]["max_steps"] == 3
    assert [step for step, values in history if "train/loss" in values] == [1, 2, 3]
    assert files_containing(tmp_path, [ENV_SECRET]) == []


def test_resume_into_a_new_run_dir_continues_the_wandb_run(tmp_path):
    # trainer.resume=<old run>/checkpoints from a new run directory: the same W&B run id.
    first, second = tmp_path / "first", tmp_path / "second"
    fit(first, Regressor(), loggers=["jsonl", "wandb"], max_steps=2, checkpoint={"save_last": True})
    run_id = (first / RUN_ID_FILE).read_text().strip()
    fit(second, Regressor(), loggers=["jsonl", "wandb"], max_steps=4, resume=str(first / "checkpoints"),
        checkpoint={"save_last": False})
    assert (second / RUN_ID_FILE).read_text().strip() == run_id
    assert all(f"-{run_id}" in os.path.basename(run) for run in offline_runs(second))
