"""The LightningCLI program (tests/support/lightning_programs/regression_cli.py, imports rewritten) run
from its command line on 2 DDP ranks (``--trainer.devices=2 --trainer.strategy=ddp``, each rank half
the batch) trains and tests as on one process at the same global batch: the logged per-step losses,
the trained weights and the test loss (rel 1e-5), with ``--optimizer`` / ``--lr_scheduler`` given on
the command line (each step a logging step, so that the recorded loss is the global batch's); the
run's config.yaml is written by rank 0."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from tests.support.lightning_cli_runs import run_fit, run_test

pytest.importorskip("jsonargparse")
pytestmark = pytest.mark.timeout(900)

RTOL = 1e-5
#: every step a logging step: the logged train_loss rank 0 records is then the global batch's (between
#: logging steps each rank holds its own half's value, docs/lightning.md)
EVERY_STEP = "--trainer.log_every_n_steps=1"
OPTIMIZER = (EVERY_STEP, "--optimizer=Adam", "--optimizer.lr=0.01", "--lr_scheduler=StepLR", "--lr_scheduler.step_size=1",
             "--lr_scheduler.gamma=0.5")
DDP2 = ("--trainer.devices=2", "--trainer.strategy=ddp")


def test_two_ranks_fit_and_test_as_one_process(tmp_path):
    directory = str(tmp_path)
    one = run_fit("ours", directory, "one", "--data.batch_size=16", *OPTIMIZER)
    two = run_fit("ours", directory, "two", "--data.batch_size=8", *DDP2, *OPTIMIZER)
    assert len(one["train_loss"]) == len(two["train_loss"]) == 8  # 2 epochs of 4 global batches of 16
    torch.testing.assert_close(torch.tensor(two["train_loss"]), torch.tensor(one["train_loss"]), rtol=RTOL, atol=0)
    for name, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], value, rtol=RTOL, atol=1e-7)
    tested_one = run_test("ours", directory, "tested_one", "one", "--data.batch_size=16")
    tested_two = run_test("ours", directory, "tested_two", "two", "--data.batch_size=8", *DDP2)
    assert tested_two["test_loss"] == pytest.approx(tested_one["test_loss"], rel=RTOL)
    with open(os.path.join(directory, "two", "config.yaml")) as f:
        saved = yaml.safe_load(f)
    assert saved["trainer"]["devices"] == 2 and saved["optimizer"]["class_path"] == "torch.optim.Adam"
