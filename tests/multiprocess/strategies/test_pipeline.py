"""Pipeline parallel (``strategy=pipeline``) computes the same training as one process.

Tolerance: CPU fp32, AdamW, rtol=1e-5 / atol=1e-6 over 15 steps (the gradients are summed per
microbatch instead of over the whole batch at once, which reorders float additions).
"""

import os

import pytest
import torch

from tests.support.helpers import BlockRegressor, fit, read_metrics
from tests.support.same_training import assert_same_training
from trainer.strategies.pipeline import PipelineStrategy
from trainer.strategies.pipeline_partition import partition_layers

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 15
GLOBAL_BATCH = 16


def run(path, strategy="single", devices=1, batch_size=GLOBAL_BATCH, **options):
    module = BlockRegressor(depth=4, val_samples=20)
    return fit(path, module, strategy=strategy, devices=devices, batch_size=batch_size, max_steps=STEPS,
               val_every_n_steps=5, **options)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    return run(path), path


def val_losses(path):
    return [r["val/loss"] for r in read_metrics(str(path)) if "val/loss" in r]


def flops_per_step(path, world):
    rows = [r for r in read_metrics(str(path)) if "perf/tflops_per_device" in r]
    assert rows, "no FLOP figures logged"
    return rows[-1]["perf/tflops_per_device"] * 1e12 * world * rows[-1]["perf/step_time_s"]


def assert_same_grad_norms(path, reference_path):
    # logged on every step without clipping: the norm over all stages (and shards), not one rank's
    norms = [[r["train/grad_norm"] for r in read_metrics(str(p)) if "train/grad_norm" in r] for p in (path, reference_path)]
    assert len(norms[0]) == STEPS
    torch.testing.assert_close(torch.tensor(norms[0]), torch.tensor(norms[1]), rtol=1e-5, atol=0)


def test_partition():
    assert partition_layers([1] * 6, 2, "uniform") == [0, 3, 6]
    assert partition_layers([1] * 5, 2, "uniform") == [0, 3, 5]
    assert partition_layers([10, 1, 1, 1, 10], 2, "parameters") == [0, 2, 5]
    assert partition_layers([1, 1, 100, 1], 3, "parameters") == [0, 2, 3, 4]
    assert partition_layers([1] * 6, 3, [1, 4]) == [0, 1, 4, 6]
    with pytest.raises(ValueError, match="fewer than the 4 stages"):
        partition_layers([1] * 3, 4, "uniform")
    with pytest.raises(ValueError, match=r"strategy.partition=\[4, 2\]"):
        partition_layers([1] * 6, 3, [4, 2])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_equal_one_process(single, tmp_path, schedule):
    piped = run(tmp_path, PipelineStrategy(schedule=schedule, microbatches=4), devices=2)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    # validation (every 5 steps, 20 samples: a short last batch padded inside the pipeline)
    assert len(val_losses(tmp_path)) == 3
    assert_same_grad_norms(tmp_path, single[1])
    # FLOPs per step (summed over the stages) are one process's (perf/* derive from them)
    assert flops_per_step(tmp_path, world=2) == pytest.approx(flops_per_step(single[1], world=1), rel=1e-6)
    torch.testing.assert_close(torch.tensor(val_losses(tmp_path)), torch.tensor(val_losses(single[1])), **TOL)


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "looped_bfs", "zero_bubble"])
def test_interleaved_equals_one_process(single, tmp_path, schedule):
    # 2 ranks x 2 virtual stages: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3.
    strategy = PipelineStrategy(schedule=schedule, microbatches=4, partition="uniform")
    assert_same_training(run(tmp_path, strategy, devices=2), single[0], steps=STEPS, tol=TOL)


def test_pipeline_by_data_parallel_equals_one_process(single, tmp_path):
    strategy = PipelineStrategy(stages=2, schedule="1f1b", microbatches=2)
    piped = run(tmp_path, strategy, devices=4, batch_size=GLOBAL_BATCH // 2)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    # validation: 10 samples per replica, a batch of 8 and one of 2 (padded inside a microbatch)
    torch.testing.assert_close(torch.tensor(val_losses(tmp_path)), torch.tensor(val_losses(single[1])), **TOL)


@pytest.mark.parametrize("schedule, accumulate", [("1f1b", 2), ("interleaved_1f1b", 1)])
def test_pipeline_by_sharded_data_parallel_equals_one_process(single, tmp_path, schedule, accumulate):
    # 2 stages x 2 replicas, each stage sharded over its replicas (FSDP inside the stage);
    # with gradient accumulation over 2 of the loop's micro-batches, or without.
    import json

    strategy = PipelineStrategy(stages=2, schedule=schedule, microbatches=2, partition="uniform", data_parallel="fsdp")
    module = BlockRegressor(depth=4, val_samples=20, record_memory=True)
    piped = fit(tmp_path / "pp", module, strategy=strategy, devices=4, batch_size=GLOBAL_BATCH // 2 // accumulate,
                accumulate_grad_batches=accumulate, max_steps=STEPS, val_every_n_steps=5)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    torch.testing.assert_close(torch.tensor(val_losses(tmp_path / "pp")), torch.tensor(val_losses(single[1])), **TOL)
    assert_same_grad_norms(tmp_path / "pp", single[1])
    # Every parameter, gradient and optimizer state is held once over the 4 ranks (sharded), not
    # once per replica: the sum over ranks is about one process's (shard padding aside).
    fit(tmp_path / "one", BlockRegressor(depth=4, record_memory=True), batch_size=GLOBAL_BATCH, max_steps=3)
    whole = json.loads((tmp_path / "one" / "memory_rank0.json").read_text())["total"]
    ranks = [json.loads((tmp_path / "pp" / f"memory_rank{r}.json").read_text())["total"] for r in range(4)]
    assert whole <= sum(ranks) <= 1.05 * whole


@pytest.mark.parametrize("options", [dict(precision="bf16-mixed"), dict(precision="fp16-mixed"), dict(precision="bf16-true"),
                                     dict(activation_checkpointing=True, compile=True)], ids=str)
def test_precision_and_speedups_equal_one_process(tmp_path, options):
    # The reference accumulates 4 micro-batches of 4, as the pipeline's microbatches: low-precision
    # matmuls then round alike (fp16-mixed also skips the same overflowing steps).
    # The reference runs with a spawned worker's intra-op threads (cores // 2 here, trainer/runtime/launch.py):
    # low-precision matmuls sum in another order on another thread count.
    steps, threads = 10, torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        single = fit(tmp_path / "single", BlockRegressor(depth=4), batch_size=4, accumulate_grad_batches=4,
                     max_steps=steps, **options)
    finally:
        torch.set_num_threads(threads)
    piped = fit(tmp_path / "pp", BlockRegressor(depth=4), strategy=PipelineStrategy(microbatches=4), devices=2,
                batch_size=16, max_steps=steps, **options)
    assert_same_training(piped, single, steps=steps, tol=TOL)


def test_clipping_uses_the_global_norm(tmp_path):
    # A small clip value so that every step is clipped: the norm must be over both stages.
    single = run(tmp_path / "single", gradient_clip_val=0.05)
    piped = run(tmp_path / "pp", PipelineStrategy(schedule="1f1b", microbatches=2), devices=2, gradient_clip_val=0.05)
    assert_same_training(piped, single, steps=STEPS, tol=TOL)
    norms = {n: [r["train/grad_norm"] for r in read_metrics(str(tmp_path / n)) if "train/grad_norm" in r] for n in ("single", "pp")}
    assert min(norms["single"]) > 0.05
    torch.testing.assert_close(torch.tensor(norms["pp"]), torch.tensor(norms["single"]), rtol=1e-5, atol=0)


def test_gpt_recipe_two_stages_equal_one_process(tmp_path):
    import functools

    from trainer.recipes.gpt import GPTModule

    def gpt_run(path, strategy="single", devices=1):
        module = GPTModule(optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), max_bytes=40_000, block_size=16,
                           layers=2, heads=2, width=32)
        from tests.support.helpers import run_trainer, train_losses

        run_trainer(path, module, strategy=strategy, devices=devices, batch_size=8, max_steps=4)
        return train_losses(str(path))

    single = gpt_run(tmp_path / "single")
    piped = gpt_run(tmp_path / "pp", PipelineStrategy(schedule="1f1b", microbatches=4, partition="uniform"), 2)
    torch.testing.assert_close(torch.tensor(piped), torch.tensor(single), **TOL)


def test_bad_inputs(tmp_path):
    from tests.support.helpers import Regressor

    with pytest.raises(ValueError, match=r"strategy.microbatches=3 does not divide data.batch_size=16"):
        run(tmp_path / "a", PipelineStrategy(microbatches=3))
    with pytest.raises(ValueError, match="exposes 3 pipeline layers, fewer than the 4 stages"):
        fit(tmp_path / "b", BlockRegressor(depth=1), strategy=PipelineStrategy(schedule="interleaved_1f1b", virtual_stages=4),
            batch_size=16, max_steps=1)
    with pytest.raises(ValueError, match=r"Regressor.pipeline_layers\(\)"):
        fit(tmp_path / "c", Regressor(), strategy=PipelineStrategy(), batch_size=16, max_steps=1)
    with pytest.raises(ValueError, match="strategy.stages=3 does not divide the world size 4"):
        run(tmp_path / "d", PipelineStrategy(stages=3), devices=4)
    with pytest.raises(ValueError, match="strategy.microbatches=1 must be >= strategy.stages=2 for schedule 1f1b"):
        run(tmp_path / "e", PipelineStrategy(microbatches=1), devices=2)
    with pytest.raises(ValueError, match="strategy.schedule='pipedream'"):
        PipelineStrategy(schedule="pipedream")


@pytest.mark.parametrize("devices, data_parallel", [(2, "ddp"), (4, "fsdp")])
def test_pipeline_checkpoint_consolidates_into_a_one_process_model(tmp_path, devices, data_parallel):
    # Each stage saves its own layers (sharded; under pipeline x FSDP, each replica its shards);
    # consolidated, they load strictly into a plain single-process model, which then computes what
    # the trained pipeline's parameters compute.
    import subprocess
    import sys

    from tests.support.helpers import REPO

    strategy = PipelineStrategy(stages=2, schedule="1f1b", microbatches=2, data_parallel=data_parallel)
    _, params = run(tmp_path / "run", strategy, devices=devices, batch_size=GLOBAL_BATCH * 2 // devices,
                    checkpoint={"save_last": True})
    out = tmp_path / "model.pt"
    result = subprocess.run(
        [sys.executable, "-m", "trainer.checkpoint", "consolidate", str(tmp_path / "run" / "checkpoints"), str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    plain, trained = BlockRegressor(depth=4), BlockRegressor(depth=4)
    for model, state in ((plain, torch.load(out, weights_only=True)), (trained, params)):
        model.configure_model()
        model.load_state_dict(state)  # strict: every layer of every stage is there
        model.eval()
    x = torch.randn(5, 6)
    assert torch.equal(plain(x), trained(x))


def test_each_rank_materialises_only_its_stages(tmp_path):
    # Built on the meta device: a rank holds at most its own stages plus one layer at any time,
    # and still trains exactly as one process (whose eager build is the reference).
    import json

    from tests.support.helpers import BuildRecorder

    def build(path, **options):
        losses, params = fit(path, BuildRecorder(depth=4), batch_size=GLOBAL_BATCH, max_steps=3, **options)
        records = [json.loads(p.read_text()) for p in sorted(path.glob("build_rank*.json"))]
        return losses, params, records

    single, single_params, [whole] = build(tmp_path / "single")
    total = sum(p.numel() for p in single_params.values())
    assert whole["most_held"] == whole["kept"] == total
    piped, piped_params, ranks = build(tmp_path / "pp", strategy=PipelineStrategy(microbatches=2), devices=2)
    reference = BuildRecorder(depth=4)
    reference.configure_model()
    largest_layer = max(sum(p.numel() for p in layer.parameters()) for layer in reference.pipeline_layers())
    assert len(ranks) == 2 and sum(r["kept"] for r in ranks) == total
    for rank in ranks:
        assert rank["most_held"] <= rank["kept"] + largest_layer < total
    assert_same_training((piped, piped_params), (single, single_params), steps=3, tol=TOL)
    # meta_init=false builds the whole model on every rank first (same training).
    eager, _, ranks = build(tmp_path / "eager", strategy=PipelineStrategy(microbatches=2, meta_init=False), devices=2)
    assert [r["most_held"] for r in ranks] == [total, total]
    torch.testing.assert_close(torch.tensor(eager), torch.tensor(single), **TOL)


def test_parameters_outside_the_layers_or_tied_across_stages_are_refused(tmp_path):
    from tests.support.helpers import TiedAcrossStages

    with pytest.raises(ValueError, match=r"\['extra'\] are in none of TiedAcrossStages.pipeline_layers\(\)"):
        fit(tmp_path / "a", TiedAcrossStages(extra=True), strategy=PipelineStrategy(), batch_size=16, max_steps=1)
    with pytest.raises(ValueError, match=r"inp.weight is used by layers of pipeline stages 0 and 1 \(tied weights\?\)"):
        # one rank, two (virtual) stages: inp in stage 0, mid (sharing inp's weight) in stage 1
        fit(tmp_path / "b", TiedAcrossStages(), batch_size=16, max_steps=1,
            strategy=PipelineStrategy(schedule="interleaved_1f1b", virtual_stages=2, partition=[1]))


def test_nan_loss_stops_the_run_under_pipeline(tmp_path):
    from tests.support.helpers import OverflowAt

    # one rank, 2 virtual stages: the loss is on the same rank (the check runs where the loss is)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss at step 3 \(epoch 0\) on rank 0"):
        fit(tmp_path, OverflowAt(bad_step=3, value=float("nan"), depth=4), batch_size=16, max_steps=5,
            strategy=PipelineStrategy(schedule="interleaved_1f1b", microbatches=2))


def test_full_format_checkpoints_are_refused_before_the_workers_start():
    # Stages hold different layers: each writes its own (sharded); resume of such runs is tested
    # (bitwise after a kill) in test_checkpoint.py.
    from trainer import Trainer

    with pytest.raises(ValueError, match=r"checkpoint.format='full' is not supported with strategy=pipeline; "
                                         r"use one of \['sharded'\]"):
        Trainer(strategy=PipelineStrategy(), devices=2, checkpoint={"format": "full"})
