"""FSDP (FSDP2 ``fully_shard``) computes the same training as DDP on the same global batch.

Tolerance: CPU fp32, AdamW, rtol=1e-5 / atol=1e-6 over 20 steps. Measured on this machine
(2026-11-21): full shard on 2 ranks is bitwise equal to DDP; hybrid 2 x 2 sums gradients in another
order and differs by at most 4e-7 (relative, losses) and 1.5e-7 (absolute, parameters).
"""

import json

import pytest
import torch

from tests.support.helpers import BlockRegressor, fit
from tests.support.same_training import assert_same_training
from trainer import Trainer
from trainer.runtime import distributed
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 20


def run(path, strategy="ddp", devices=2, batch_size=8, module=None, **options):
    return fit(path, module or BlockRegressor(), strategy=strategy, devices=devices, batch_size=batch_size,
               max_steps=STEPS, **options)


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    """2 ranks x 8 samples: global batch 16."""
    return run(tmp_path_factory.mktemp("ddp"))


def test_reference_trains(ddp_reference):
    # Guards the comparisons against two runs that did nothing.
    losses, params = ddp_reference
    assert losses[-1] < 0.5 * losses[0]
    assert {"inp.weight", "blocks.0.linear.weight", "out.bias"} <= params.keys()


@pytest.mark.parametrize("sharding", ["full", "grad_op", "no_shard"])
def test_sharding_mode_equals_ddp(ddp_reference, tmp_path, sharding):
    # (a clean exit of every strategy: tests/multiprocess/strategies/test_clean_exit.py, which reads the
    # ranks' own stderr; workers forked by the test session's fork server write elsewhere than capfd)
    assert_same_training(run(tmp_path, FSDPStrategy(sharding=sharding)), ddp_reference, steps=STEPS, tol=TOL)


def test_hybrid_two_by_two_equals_ddp(ddp_reference, tmp_path):
    # 4 ranks x 4 samples = the same global batch of 16; shard within pairs, replicate across.
    hybrid = run(tmp_path, FSDPStrategy(sharding="hybrid", shard_size=2), devices=4, batch_size=4)
    assert_same_training(hybrid, ddp_reference, steps=STEPS, tol=TOL)


@pytest.mark.parametrize("sync_every_microbatch", [False, True])
def test_accumulation_equals_big_batch(ddp_reference, tmp_path, sync_every_microbatch):
    # 2 ranks x 2 micro-batches x 4 samples = 16, with or without a reduce-scatter per micro-batch.
    strategy = FSDPStrategy(sync_every_microbatch=sync_every_microbatch)
    accumulated = run(tmp_path, strategy, batch_size=4, accumulate_grad_batches=2)
    assert_same_training(accumulated, ddp_reference, steps=STEPS, tol=TOL)


def test_clipping_norm_equals_one_process(tmp_path):
    # A small clip value so that every step is clipped: the norm must be the global one.
    single = run(tmp_path / "single", "single", devices=1, batch_size=16, gradient_clip_val=0.05)
    sharded = run(tmp_path / "fsdp", FSDPStrategy(), gradient_clip_val=0.05)
    assert_same_training(sharded, single, steps=STEPS, tol=TOL)
    from tests.support.helpers import read_metrics

    norms = {name: [r["train/grad_norm"] for r in read_metrics(str(tmp_path / name))] for name in ("single", "fsdp")}
    assert min(norms["single"]) > 0.05  # clipping was active
    torch.testing.assert_close(torch.tensor(norms["fsdp"]), torch.tensor(norms["single"]), rtol=1e-5, atol=0)


def test_meta_init_matches_eager(tmp_path):
    eager = run(tmp_path / "eager", FSDPStrategy())
    meta = run(tmp_path / "meta", FSDPStrategy(meta_init=True))
    assert_same_training(meta, eager, steps=STEPS, tol=TOL)


def test_validation_is_exact_with_uneven_shards(tmp_path):
    # 9 validation samples, batch 2, 2 ranks: rank 0 has 3 batches, rank 1 two; FSDP pads rank 1
    # with a zero-weight forward so both gather parameters the same number of times.
    module = lambda: BlockRegressor(val_samples=9)  # noqa: E731
    single = fit(tmp_path / "single", module(), batch_size=4, max_steps=2)
    sharded = fit(tmp_path / "fsdp", module(), strategy=FSDPStrategy(), devices=2, batch_size=2, max_steps=2)
    from tests.support.helpers import read_metrics

    val = {name: [r for r in read_metrics(str(tmp_path / name)) if "val/loss" in r] for name in ("single", "fsdp")}
    assert len(val["single"]) == len(val["fsdp"]) == 1
    assert val["fsdp"][0]["val/loss"] == pytest.approx(val["single"][0]["val/loss"], rel=1e-5)


def test_full_shard_halves_training_state_memory(tmp_path):
    # fp32 AdamW: parameters 4 + gradients 4 + two moments 8 = 16 bytes per parameter on every DDP
    # rank; full sharding over 2 ranks keeps half of each (plus padding of uneven shards).
    module = lambda: BlockRegressor(width=64, depth=4, record_memory=True)  # noqa: E731
    run(tmp_path / "ddp", module=module())
    run(tmp_path / "fsdp", FSDPStrategy(), module=module())
    num_params = sum(p.numel() for p in torch.load(tmp_path / "ddp" / "params.pt").values())
    ddp = [json.loads((tmp_path / "ddp" / f"memory_rank{r}.json").read_text()) for r in range(2)]
    fsdp = [json.loads((tmp_path / "fsdp" / f"memory_rank{r}.json").read_text()) for r in range(2)]
    for rank in range(2):
        # Optimizer state also holds AdamW's step counters (a few bytes per tensor).
        assert ddp[rank]["parameters"] == ddp[rank]["gradients"] == 4 * num_params
        assert 16 * num_params <= ddp[rank]["total"] < 16 * num_params + 1024
        ratio = fsdp[rank]["total"] / ddp[rank]["total"]
        assert 0.45 < ratio < 0.56, f"rank {rank}: FSDP/DDP training-state bytes = {ratio:.3f}, expected ~0.5"
    # The shards add up to the whole model (nothing lost, little padding).
    assert 4 * num_params <= sum(f["parameters"] for f in fsdp) < 4 * num_params * 1.05


# ----- bad input: clear errors naming the value, raised before any worker starts ------------------------
def test_unknown_sharding_mode():
    with pytest.raises(ValueError, match=r"strategy.sharding='zero3' is not one of full, grad_op, no_shard, hybrid"):
        FSDPStrategy(sharding="zero3")


def test_hybrid_shard_size_must_divide_world_size():
    with pytest.raises(ValueError, match=r"strategy.shard_size=3 does not divide the world size 4.*\[1, 2, 4\]"):
        Trainer(strategy=FSDPStrategy(sharding="hybrid", shard_size=3), devices=4)


def test_shard_size_without_hybrid():
    with pytest.raises(ValueError, match=r"strategy.shard_size=2: only strategy.sharding=hybrid"):
        FSDPStrategy(sharding="full", shard_size=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only hosts refuse offload")
def test_cpu_offload_needs_cuda():
    with pytest.raises(ValueError, match=r"strategy.cpu_offload=true needs a CUDA device"):
        FSDPStrategy(cpu_offload=True)


def test_bad_dtype():
    with pytest.raises(ValueError, match=r"strategy.param_dtype='bf61' is not a dtype"):
        FSDPStrategy(param_dtype="bf61")


def test_bf16_param_dtype_trains_close_to_fp32(ddp_reference, tmp_path):
    # Mixed-precision policy: compute in bf16 (8 mantissa bits), fp32 sharded master weights and
    # fp32 gradient reduction. The loss curve stays within 5% of fp32's over 20 steps.
    losses, params = run(tmp_path, FSDPStrategy(param_dtype="bf16", reduce_dtype="fp32"))
    reference, _ = ddp_reference
    assert all(p.dtype == torch.float32 for p in params.values())
    assert losses != reference  # bf16 really was used
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=0.05, atol=0.01)


@pytest.mark.gpu
def test_cpu_offload_on_gpu_equals_no_offload(tmp_path):
    # Runs on a GPU machine only: shards and optimizer state live in CPU memory.
    plain = run(tmp_path / "plain", FSDPStrategy(accelerator="cuda"), devices=1, batch_size=16)
    offload = run(tmp_path / "offload", FSDPStrategy(accelerator="cuda", cpu_offload=True), devices=1, batch_size=16)
    assert_same_training(offload, plain, steps=STEPS, tol=TOL)


def test_one_process_still_shards_and_matches_single(tmp_path):
    # strategy=fsdp with one device: a 1-rank mesh, so the FSDP policies still apply.
    single = run(tmp_path / "single", "single", devices=1, batch_size=16)
    strategy, alive = FSDPStrategy(), distributed.destroyed_groups_alive()
    alone = run(tmp_path / "fsdp", strategy, devices=1, batch_size=16)
    assert_same_training(alone, single, steps=STEPS, tol=TOL)
    # Its group of one (gloo threads) is gone once the run's objects are, although the user keeps
    # the strategy: nothing else (DTensor's caches, torch's default arguments) holds it.
    assert distributed.destroyed_groups_alive() <= alive
