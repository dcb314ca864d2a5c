"""Every strategy computes the same training as one process on the same global batch.

Tolerance: CPU fp32. The multi-rank runs sum gradients in a different order (all-reduce) than one
process, which changes the last bits (~1e-7 relative per step); over 8 SGD-momentum steps that
stays below 1e-5, so losses and parameters are compared with rtol=1e-5, atol=1e-6.
"""

import pytest
import torch

from tests.support.helpers import Regressor, fit
from tests.support.same_training import assert_same_training

pytestmark = pytest.mark.timeout(240)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 8  # helpers.fit's default max_steps


@pytest.fixture(scope="module")
def single_16(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("single16"), batch_size=16)


def test_training_changes_parameters(single_16, tmp_path):
    # Guards the equivalence tests against comparing two runs that did nothing.
    losses, params = single_16
    assert losses[-1] < losses[0]
    initial = Regressor().net.state_dict()
    assert not torch.allclose(params["0.weight"], initial["0.weight"])


def test_ddp_two_ranks_equals_one_process(single_16, tmp_path):
    assert_same_training(fit(tmp_path, strategy="ddp", devices=2, batch_size=8), single_16, steps=STEPS, tol=TOL)


def test_accumulation_on_two_ranks_equals_big_batch(tmp_path):
    # 2 ranks x 4 micro-batches x 4 samples == one process with batch 32; the last global batch
    # of the epoch is short (200 = 6 x 32 + 8), so the exact weighting of short windows is covered.
    single = fit(tmp_path / "single", batch_size=32, max_steps=8)
    ddp = fit(tmp_path / "ddp", strategy="ddp", devices=2, batch_size=4, accumulate_grad_batches=4, max_steps=8)
    assert_same_training(ddp, single, steps=STEPS, tol=TOL)


def test_accumulation_in_one_process_equals_big_batch(single_16, tmp_path):
    assert_same_training(fit(tmp_path, batch_size=4, accumulate_grad_batches=4), single_16, steps=STEPS, tol=TOL)


def test_zero1_equals_ddp_adamw(tmp_path):
    module = lambda: Regressor(optimizer="adamw", lr=0.01)  # noqa: E731
    plain = fit(tmp_path / "single", module(), batch_size=16)
    zero1 = fit(tmp_path / "zero1", module(), strategy=__import__("trainer.strategies.ddp", fromlist=["x"]).DDPStrategy(zero1=True),
                devices=2, batch_size=8)
    assert_same_training(zero1, plain, steps=STEPS, tol=TOL)


def test_non_final_micro_batches_skip_the_all_reduce(tmp_path):
    import json

    fit(tmp_path, Regressor(count_syncs=True), strategy="ddp", devices=2, batch_size=4, accumulate_grad_batches=4, max_steps=3)
    syncs = json.loads((tmp_path / "syncs.json").read_text())
    # One bucket for this small model: exactly one all-reduce per optimizer step, none on the
    # first K-1 micro-batches (without no_sync it would be 4 per step).
    assert syncs == [1, 1, 1]


def test_gradient_clipping_matches_single_process(single_16, tmp_path):
    single = fit(tmp_path / "single", batch_size=16, gradient_clip_val=0.05)
    ddp = fit(tmp_path / "ddp", strategy="ddp", devices=2, batch_size=8, gradient_clip_val=0.05)
    assert_same_training(ddp, single, steps=STEPS, tol=TOL)
    with pytest.raises(AssertionError):  # clipping really changed the training
        assert_same_training(single, single_16, steps=STEPS, tol=TOL)


def test_fused_fp16_ddp_and_zero1_equal_one_process_and_skip_the_same_overflow(tmp_path):
    # fp16 with a fused AdamW steps with no host read (the kernel skips on the device overflow flag;
    # under ZeRO-1 the flag goes to the optimizer over the rank's shard, the one that steps). Step 3's loss is infinite on rank 0 (OverflowAt): both runs skip it, halve the scale
    # (hysteresis=1) and go on identically. Tolerance 2e-3: fp16 autocast rounds the per-rank
    # partial sums of the weight gradients (8 samples on each of 2 ranks vs 16 in one) differently.
    from functools import partial

    from tests.support.helpers import OverflowAt, read_metrics
    from trainer.precision import Precision
    from trainer.strategies.ddp import DDPStrategy

    def module():
        chosen = OverflowAt(bad_step=3, bad_rank=0)
        chosen.optimizer_factory = partial(torch.optim.AdamW, lr=0.01, weight_decay=0.01, fused=True)
        return chosen

    def precision():
        return Precision("fp16-mixed", initial_scale_power=10, hysteresis=1)

    single = fit(tmp_path / "single", module(), batch_size=16, precision=precision())
    ddp = fit(tmp_path / "ddp", module(), strategy="ddp", devices=2, batch_size=8, precision=precision())
    zero1 = fit(tmp_path / "zero1", module(), strategy=DDPStrategy(zero1=True), devices=2, batch_size=8,
                precision=precision())
    for run in ("single", "ddp", "zero1"):
        rows = [r for r in read_metrics(str(tmp_path / run)) if "train/loss_scale" in r]
        assert [r["train/loss_scale"] for r in rows] == [1024.0] * 2 + [512.0] * 6, run
        assert [r["train/skipped_steps"] for r in rows] == [0, 0] + [1] * 6, run
    (losses_a, params_a) = single
    for losses_b, params_b in (ddp, zero1):
        assert losses_a[2] is None and losses_b[2] is None  # the infinite loss (null in metrics.jsonl)
        finite = [i for i in range(8) if i != 2]
        torch.testing.assert_close(torch.tensor([losses_a[i] for i in finite]),
                                   torch.tensor([losses_b[i] for i in finite]), rtol=2e-3, atol=2e-3)
        for name in params_a:  # a step taken on inf gradients would leave NaNs (assert_close fails on NaN)
            torch.testing.assert_close(params_a[name], params_b[name], rtol=2e-3, atol=2e-3, msg=f"parameter {name}")
