"""Lightning's loop semantics on 2 ranks (the trainer spawns them) equal one process at the same global
batch: each rank loads half the one-process batch. The one-process runs are checked against Lightning
itself in tests/unit/api/test_lightning_loop_semantics.py."""

from __future__ import annotations

import json

import pytest
import torch

import trainer.lightning as L
from tests.support.lightning_loop_modules import (AddIndexOrNot, EpochEndAgain, EvalStep, Module, Recording, SeveralLoaders,
                                                  Skip, recorded_rows, run_call)

pytestmark = pytest.mark.timeout(600)
TWO_RANKS = dict(strategy="ddp", devices=2, accelerator="cpu")


def test_minus_one_on_one_rank_skips_the_epoch_on_every_rank(tmp_path):
    # Sample 6 is in the second global batch (4..7): on 2 ranks only rank 1 holds it, and every rank skips.
    one_module, two_module = Skip(batch_size=4, skip_sample=6), Skip(batch_size=2, skip_sample=6)
    one, _ = run_call(L, one_module, "fit", str(tmp_path / "one"), max_epochs=2)
    two, _ = run_call(L, two_module, "fit", str(tmp_path / "two"), max_epochs=2, **TWO_RANKS)
    assert one.global_step == two.global_step == 5
    torch.testing.assert_close(two_module.layer.weight, one_module.layer.weight, rtol=1e-6, atol=1e-7)
    for name in ("l_epoch", "v"):
        assert float(two.callback_metrics[name]) == pytest.approx(float(one.callback_metrics[name]), rel=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_evaluation_step_values_are_the_global_batches_values(tmp_path, strategy):
    # One process: batches of 2; two ranks: batches of 1 each (the same global batches; 5 samples, so
    # the last global batch has one rank's batch only). FSDP runs the forwards in lockstep.
    names = ("vs_step", "vo", "ts_step")
    rows = {}
    for ranks, flags in ((1, {}), (2, dict(TWO_RANKS, strategy=strategy))):
        path = str(tmp_path / f"{ranks}.jsonl")
        module = EvalStep(batch_size=4 // ranks, eval_batch=2 // ranks)
        trainer, _ = run_call(L, module, "fit", str(tmp_path / str(ranks)), max_epochs=1, logger=Recording(path),
                              **flags)
        trainer.test(module, verbose=False)
        rows[ranks] = recorded_rows(path, names)
    assert [row["step"] for row in rows[2]] == [0, 1, 2, 0, 1, 2]
    assert rows[2] == [pytest.approx(row, rel=1e-5) for row in rows[1]]


def test_a_stop_mid_epoch_ends_the_epoch_alike_on_two_ranks(tmp_path):
    # trainer.should_stop = True after step 2 (of 4 per epoch): the epoch ends (its hooks, l_epoch) on both.
    one_module, two_module = Module(batch_size=4, stop_at_step=2), Module(batch_size=2, stop_at_step=2)
    one, _ = run_call(L, one_module, "fit", str(tmp_path / "one"), max_epochs=3)
    two, _ = run_call(L, two_module, "fit", str(tmp_path / "two"), max_epochs=3, **TWO_RANKS)
    assert (one.global_step, one.current_epoch) == (two.global_step, two.current_epoch) == (2, 1)
    torch.testing.assert_close(two_module.layer.weight, one_module.layer.weight, rtol=1e-6, atol=1e-7)
    for name in ("l_epoch", "v"):
        assert float(two.callback_metrics[name]) == pytest.approx(float(one.callback_metrics[name]), rel=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_several_test_and_predict_loaders_on_two_ranks_as_one_process(tmp_path, strategy):
    # Each loader has its own plan: loader 1 (3 samples) leaves rank 1 without a batch at its last position.
    results = {}
    for ranks, flags in ((1, {}), (2, dict(TWO_RANKS, strategy=strategy))):
        trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=str(tmp_path / str(ranks)), **flags)
        module = SeveralLoaders(eval_batch=2 // ranks)
        results[ranks] = (trainer.test(module, verbose=False), trainer.predict(module))
    (tested_one, predicted_one), (tested_two, predicted_two) = results[1], results[2]
    assert tested_two == [pytest.approx(d, rel=1e-6) for d in tested_one]
    assert len(predicted_two) == len(predicted_one) == 2
    for two, one in zip(predicted_two, predicted_one):
        torch.testing.assert_close(torch.cat(two), torch.cat(one))


def test_the_loggers_rows_and_the_results_per_loader_on_two_ranks_as_one_process(tmp_path):
    # Every row as Lightning writes it (the epoch added, its step), a name logged per step and again at
    # the epoch end, and the test results per loader (names logged without the loader's index).
    seen = {}
    for ranks, flags in ((1, {}), (2, TWO_RANKS)):
        path = str(tmp_path / f"{ranks}.jsonl")
        trainer, _ = run_call(L, EpochEndAgain(batch_size=4 // ranks, eval_batch=2 // ranks), "fit",
                              str(tmp_path / str(ranks)), max_epochs=2, logger=Recording(path), **flags)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        shown = {name: float(value) for name, value in trainer.callback_metrics.items()}
        seen[ranks] = (rows, shown, trainer.test(AddIndexOrNot(eval_batch=2 // ranks), verbose=False))
    (rows_one, shown_one, tested_one), (rows_two, shown_two, tested_two) = seen[1], seen[2]
    assert rows_two == [pytest.approx(row, rel=1e-6) for row in rows_one] and rows_one[0]["step"] == 0
    assert shown_two == pytest.approx(shown_one, rel=1e-6) and shown_two["shared"] == 111.0
    assert tested_two == tested_one and set(tested_one[1]) == {"common/dataloader_idx_1", "only_1", "b", "e"}
