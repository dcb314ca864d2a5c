"""The machinery of bench/lightning_examples.py (which runs Lightning's example programs, not part of this
repository) on a program of our own written as a Lightning user writes one
(tests/support/lightning_example_programs/cli_regressor.py: ``import lightning``, LightningCLI):
ported by rewriting its imports, run by its own command line in fresh processes, its per-batch losses
recorded. One process accumulating 2 batches per step and DDP 2 (``--trainer.devices=2
--trainer.strategy=ddp``) give the same per-step losses (rel 1e-5) on the same global batches, and the
losses move (the program trains)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import _lightning_example_harness as harness  # noqa: E402

pytestmark = pytest.mark.timeout(240)

PROGRAMS = os.path.join(ROOT, "tests", "support", "lightning_example_programs")
ARGS = ["fit", "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.enable_checkpointing=false", "--data.batch_size=4"]


def test_ported_source_rewrites_only_import_lines():
    source = ("import lightning as L\nfrom lightning.pytorch.demos import WikiText2\n"
              "from pytorch_lightning.callbacks import EarlyStopping\nname = 'lightning.pytorch.demos'\n")
    assert harness.ported_source(source) == (
        "import trainer.lightning as L\nfrom lightning_demos_ported import WikiText2\n"
        "from trainer.lightning.callbacks import EarlyStopping\nname = 'lightning.pytorch.demos'\n")


def test_step_losses_weigh_each_batch_by_its_samples():
    one = {0: [{"epoch": 0, "batch_idx": i, "loss": loss, "n": n}
               for i, (loss, n) in enumerate([(1.0, 4), (4.0, 2), (2.0, 4), (8.0, 4), (5.0, 1)])]}
    assert harness.step_losses(one, accumulate=2) == [2.0, 5.0, 5.0]
    ranks = {0: [{"epoch": 0, "batch_idx": 0, "loss": 1.0, "n": 3}],
             1: [{"epoch": 0, "batch_idx": 0, "loss": 3.0, "n": 1}]}
    assert harness.step_losses(ranks) == [1.5]
    assert harness.compare([1.0, 2.0], [1.0, 2.0 + 1e-3], 1e-5)[0] is False


def test_own_cli_program_on_ddp_2_as_on_one_process(tmp_path):
    ported = str(tmp_path / "ported")
    harness.port(PROGRAMS, ported)
    with open(os.path.join(ported, "cli_regressor.py")) as f:
        assert "from trainer.lightning.cli import LightningCLI" in f.read()
    program = os.path.join(ported, "cli_regressor.py")
    runs = {}
    for label, flags in (("single", ["--trainer.accumulate_grad_batches=2"]),
                         ("ddp", ["--trainer.devices=2", "--trainer.strategy=ddp"])):
        runs[label] = harness.run("mirror", program, ARGS + flags, str(tmp_path / "out" / label),
                                  str(tmp_path / "cwd" / label), pythonpath=[ported], timeout=200)
        assert runs[label].error is None, runs[label].output_tail
    single = harness.step_losses(runs["single"].records, accumulate=2)
    ddp = harness.step_losses(runs["ddp"].records)
    assert sorted(runs["ddp"].records) == [0, 1]
    assert len(single) == 3 and len(set(single)) == 3, single  # three steps, the loss moving
    equal, worst = harness.compare(ddp, single, rtol=1e-5)
    assert equal, (ddp, single, worst)
