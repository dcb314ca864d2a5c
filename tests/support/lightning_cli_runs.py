"""Runs of the LightningCLI program (tests/support/lightning_programs/regression_cli.py) from its own
command line, as its user runs it: a fresh interpreter whose ``sys.argv[1:]`` is the command line,
under Lightning (``side="lightning"``) or under this trainer with the program's imports rewritten
(``side="ours"``). The command line is the same on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.support.helpers import REPO

#: the program's module on each side
MODULES = {"lightning": "tests.support.lightning_programs.regression_cli",
           "ours": "tests.support.lightning_as_ours.regression_cli"}

#: the config file of the runs (the command line overrides parts of it)
CONFIG = """\
seed_everything: 7
trainer:
  max_epochs: 2
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  accelerator: cpu
  devices: 1
model:
  hidden: 8
data:
  batch_size: 8
"""


def write_config(directory: str) -> str:
    path = os.path.join(directory, "config.yaml")
    with open(path, "w") as f:
        f.write(CONFIG)
    return path


def run_cli(side: str, directory: str, *args: str, check: bool = True, timeout: int = 400) -> subprocess.CompletedProcess:
    """``python -c 'main()' ARGS`` in ``directory`` (the program's ``main`` builds its LightningCLI)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    code = f"from {MODULES[side]} import main; main()"
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=directory, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{side} {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def run_fit(side: str, directory: str, name: str, *overrides: str) -> dict:
    """``fit --config config.yaml`` with ``overrides`` and the recording callback (``LossRecorder``, by
    its short name); the record (``train_loss`` per step) with the trained weights (``weights``)."""
    run_cli(side, directory, "fit", "--config", write_config(directory), f"--trainer.default_root_dir={name}",
            "--trainer.callbacks+=LossRecorder", f"--trainer.callbacks.path={name}.json", *overrides)
    return read(directory, name, weights=True)


def run_test(side: str, directory: str, name: str, weights_of: str, *overrides: str) -> dict:
    """``test`` of the weights a `run_fit` named ``weights_of`` wrote; the record (``test_loss``)."""
    run_cli(side, directory, "test", "--config", write_config(directory), f"--trainer.default_root_dir={name}",
            f"--model.init_weights={weights_of}.json.pt", "--trainer.callbacks+=LossRecorder",
            f"--trainer.callbacks.path={name}.json", *overrides)
    return read(directory, name)


def read(directory: str, name: str, weights: bool = False) -> dict:
    with open(os.path.join(directory, name + ".json")) as f:
        record = json.load(f)
    if weights:
        record["weights"] = torch.load(os.path.join(directory, name + ".json.pt"))
    return record
