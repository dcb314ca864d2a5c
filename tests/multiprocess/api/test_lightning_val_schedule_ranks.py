"""Lightning's validation schedule and data reads on 2 ranks (the trainer spawns them) equal one process
at the same global batch: each rank loads half the one-process batch. The one-process runs are checked
against Lightning itself in tests/unit/api/test_lightning_val_schedule.py."""

from __future__ import annotations

import pytest
import torch

import trainer.lightning as L
from tests.support.lightning_loop_modules import Recording, recorded_rows, run_call
from tests.support.lightning_schedule_modules import Schedule

pytestmark = pytest.mark.timeout(600)
TWO_RANKS = dict(strategy="ddp", devices=2, accelerator="cpu")


def _fit(tmp_path, ranks, options, **flags):
    """(module, the rows logged with "v" or "l_epoch") of a fit on ``ranks`` processes."""
    path = str(tmp_path / f"{ranks}.jsonl")
    module = Schedule(batch_size=2 // ranks, eval_batch=2 // ranks, **options)
    run_call(L, module, "fit", str(tmp_path / str(ranks)), logger=Recording(path),
             **(dict(TWO_RANKS) if ranks == 2 else {}), **flags)
    return module, recorded_rows(path, ("v", "l_epoch"))


def test_the_schedule_and_a_deferred_random_read_on_two_ranks_as_one_process(tmp_path):
    # Every 2nd epoch (of 8 global batches) validates every 3 steps; val_dataloader() draws random data
    # at its first read (epoch 1, no sanity pass), under a seed the ranks share.
    flags = dict(val_check_interval=3, check_val_every_n_epoch=2, max_epochs=4)
    (one_module, one), (two_module, two) = (_fit(tmp_path, ranks, {"random": True}, **flags) for ranks in (1, 2))
    # (a row's step is its last batch's index, as Lightning numbers it: trainer/loop/logged_rows.py)
    assert [row["step"] for row in two if "v" in row] == [10, 13, 26, 29]
    assert two == [pytest.approx(row, rel=1e-5) for row in one]
    torch.testing.assert_close(two_module.layer.weight, one_module.layer.weight, rtol=1e-6, atol=1e-7)


def test_overfit_batches_with_custom_samplers_on_two_ranks_as_one_process(tmp_path):
    # Both loaders read through a reversing sampler, turned off by overfit_batches=2: the first 2 global
    # batches of each set, in dataset order, drawn at random by both hooks under one seed.
    flags = dict(overfit_batches=2, max_epochs=3, num_sanity_val_steps=2)
    (one_module, one), (two_module, two) = (_fit(tmp_path, ranks, {"random": True, "sampler": True}, **flags)
                                            for ranks in (1, 2))
    assert [row["step"] for row in two if "v" in row] == [1, 3, 5]
    assert two == [pytest.approx(row, rel=1e-5) for row in one]
    torch.testing.assert_close(two_module.layer.weight, one_module.layer.weight, rtol=1e-6, atol=1e-7)
