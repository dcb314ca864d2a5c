"""strategy=nd's tensor-parallel ranks share one random stream: dropout on an activation every rank of
a tensor-parallel group holds replicated draws the same mask on each, so the ranks compute the same
loss and keep their replicated parameters equal (with a stream per rank they drift apart silently)."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import run_trainer
from tests.support.nd_modules import DropoutClassifier
from trainer.strategies.nd import NDStrategy

pytestmark = pytest.mark.timeout(300)
STEPS = 6


def test_tp_ranks_draw_the_same_dropout_masks(tmp_path):
    run_trainer(tmp_path, DropoutClassifier(), strategy=NDStrategy(tp=2), devices=2, batch_size=8, max_steps=STEPS)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert len(ranks[0]["losses"]) == STEPS
    # Bitwise: the same samples, the same masks, the same all-reduced partial sums on both ranks.
    assert ranks[0]["losses"] == ranks[1]["losses"]
    replicated = ranks[0]["replicated"]
    assert {"inp.weight", "norm.weight", "out.weight"} <= replicated.keys()
    for name, value in replicated.items():
        assert torch.equal(value, ranks[1]["replicated"][name]), name
    # The dropout was active: without it the losses differ.
    run_trainer(tmp_path / "p0", DropoutClassifier(p=0.0), strategy=NDStrategy(tp=2), devices=2, batch_size=8,
                max_steps=STEPS)
    assert torch.load(tmp_path / "p0" / "rank0.pt")["losses"][1:] != ranks[0]["losses"][1:]
