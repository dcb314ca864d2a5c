"""torchmetrics objects logged by a Lightning program (tests/support/metrics_program.py, its import
rewritten) on 2 DDP ranks and 2 FSDP ranks equal one process, on validation and test sets the ranks
split unevenly (FSDP adds a padding batch there, whose metric updates are undone)."""

from __future__ import annotations

import pytest

from tests.support.metrics_program_runs import EPOCHS, TOL, our_run

pytestmark = pytest.mark.timeout(300)

EXACT_ON_ANY_WORLD = ["train/acc_step", "train/acc_epoch", "train/loss", "probe/loss", "val/acc", "val/count",
                      "val/f1", "val/precision", "val/acc_best", "test/acc"]


UNEVEN = dict(num_sanity_val_steps=2, track_best=True, val_samples=33)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return our_run(tmp_path_factory.mktemp("one"), **UNEVEN)[0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tmp_path, strategy, one_process):
    # 33 validation (and test) samples: ranks hold 17 and 16 (5 and 4 batches of 4; FSDP pads rank 1 with a
    # batch that must not count). val/loss is a MeanMetric of batch means, which depends on how the set is
    # batched, so it is left out; every other value is exact on any world size.
    one = one_process
    two, _ = our_run(tmp_path, devices=2, strategy=strategy, **UNEVEN)
    assert one["val/count"] == [33.0] * EPOCHS
    for key in EXACT_ON_ANY_WORLD:
        assert two.get(key) == pytest.approx(one[key], **TOL), key
