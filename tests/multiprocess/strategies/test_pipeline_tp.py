"""Pipeline parallel composed with tensor parallel (and FSDP over the replicas) on one mesh
computes the same training as one process.

Tolerance: CPU fp32, SGD with momentum, rtol=1e-5 / atol=1e-6 over 15 steps: the gradients are
summed per microbatch, and the row-parallel layers sum their partial products over the
tensor-parallel ranks, both of which reorder float additions (measured: losses within 7e-7,
parameters within 2e-7). Not AdamW: it divides each element's step by that element's gradient
size, so an element whose gradient nearly cancels over the batch turns that reordering into a
visible step (seen: 6e-5 on one weight of 4.5 K after 15 steps).
"""

import json
import re

import pytest
import torch
from torch import nn

from tests.support.helpers import BlockRegressor, fit, read_metrics
from tests.support.same_training import assert_same_training
from trainer.strategies import resolve_strategy
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 15
GLOBAL_BATCH = 16
CLIP = 12.0


class MLPBlock(nn.Module):
    """A pre-norm residual MLP block: ``up`` split by columns, ``down`` by rows over the
    tensor-parallel ranks (the norm stays whole on each)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class TensorParallelRegressor(BlockRegressor):
    """A module of one's own with a tensor-parallel plan and pipeline layers (``inp``, the blocks,
    ``out``). Records each rank's local parameter shapes when training starts
    (``<run_dir>/shapes_rank<r>.json``), to show what the plan split."""

    def configure_optimizers(self):
        # SGD with momentum (the suite's regression default): AdamW would divide each element's step
        # by its own gradient's size, so an element whose gradient nearly cancels over the batch
        # would turn the summation-order noise of the row-parallel sums into a visible step.
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    def configure_model(self):
        self.inp = nn.Linear(6, self.width)
        self.blocks = nn.ModuleList(MLPBlock(self.width) for _ in range(self.depth))
        self.out = nn.Linear(self.width, 1)

    def block_classes(self):
        return (MLPBlock,)

    def tensor_parallel_plan(self):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def on_train_start(self):
        from torch.distributed.tensor import DTensor

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        shapes = {n: list((p.to_local() if isinstance(p, DTensor) else p).shape) for n, p in self.named_parameters()}
        with open(f"{self.trainer.run_dir}/shapes_rank{rank}.json", "w") as f:
            json.dump(shapes, f)


def run(path, strategy="single", devices=1, batch_size=GLOBAL_BATCH, **options):
    module = TensorParallelRegressor(width=16, depth=4, val_samples=20)
    return fit(path, module, strategy=strategy, devices=devices, batch_size=batch_size, max_steps=STEPS,
               val_every_n_steps=5, **options)


def logged(path, key):
    return [r[key] for r in read_metrics(str(path)) if key in r]


def shapes(path, rank):
    return json.loads((path / f"shapes_rank{rank}.json").read_text())


def held_fractions(path, ranks_per_stage):
    """Each rank's share of its stage's parameters, from the run's log (the stages' sizes and the
    model summary's "Params held per rank" line, in thousands to one decimal)."""
    log = (path / "train.log").read_text()
    stages = [int(n) for n in re.findall(r"stage \d \(pp rank \d\): layers \d+-\d+, (\d+) parameters", log)]
    held = [float(n) * 1000 for n in re.findall(r"rank \d: ([\d.]+) K", log.split("Params held per rank:")[1].splitlines()[0])]
    assert len(stages) == 2 and len(held) == 2 * ranks_per_stage, (stages, held)
    return [count / stages[rank // ranks_per_stage] for rank, count in enumerate(held)]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    # clipped on the steps whose norm is above CLIP (about half): the norm must span every stage and shard
    return run(path, gradient_clip_val=CLIP), path


def test_two_stages_by_two_tensor_parallel_ranks_equal_one_process(single, tmp_path):
    # 4 ranks: stages 0 and 1, each split over 2 tensor-parallel ranks (rank = pp * 2 + tp),
    # built from the yaml's defaults as strategy=pipeline strategy.tp=2 would be.
    strategy = resolve_strategy("pipeline", stages=2, tp=2, microbatches=2, partition="uniform")
    piped = run(tmp_path, strategy, devices=4, gradient_clip_val=CLIP)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    norms = [logged(p, "train/grad_norm") for p in (tmp_path, single[1])]
    assert len(norms[0]) == STEPS and min(norms[1]) < CLIP < max(norms[1])
    torch.testing.assert_close(torch.tensor(norms[0]), torch.tensor(norms[1]), rtol=1e-5, atol=0)
    # validation (20 samples, every 5 steps): the last stage's first tensor-parallel rank reports
    torch.testing.assert_close(torch.tensor(logged(tmp_path, "val/loss")), torch.tensor(logged(single[1], "val/loss")), **TOL)
    assert len(logged(tmp_path, "val/loss")) == 3
    # Each rank holds its own stage (layers inp, blocks.0, blocks.1 | blocks.2, blocks.3, out),
    # its blocks' up / down split in halves, the rest whole.
    whole = shapes(single[1], 0)
    for rank in range(4):
        mine = shapes(tmp_path, rank)
        layers = {".".join(n.split(".")[:2]) if n.startswith("blocks.") else n.split(".")[0] for n in mine}
        assert layers == ({"inp", "blocks.0", "blocks.1"} if rank < 2 else {"blocks.2", "blocks.3", "out"})
        for name, shape in mine.items():
            expected = list(whole[name])
            if ".up." in name or name.endswith("down.weight"):
                expected[0 if ".up." in name else 1] //= 2
            assert shape == expected, (rank, name)


def test_nd_with_pipeline_stages_is_the_pipeline_on_the_nd_mesh(single, tmp_path):
    # strategy=nd strategy.pp=2 strategy.tp=2 (dp_shard -1 = 1 on 4 ranks) builds this pipeline, named nd,
    # and trains as one process; FSDP-only settings are refused with pp > 1, pipeline ones with pp = 1.
    strategy = resolve_strategy("nd", pp=2, tp=2, microbatches=2, partition="uniform")
    assert isinstance(strategy, PipelineStrategy) and strategy.name == "nd"
    assert_same_training(run(tmp_path, strategy, devices=4, gradient_clip_val=CLIP), single[0], steps=STEPS, tol=TOL)
    with pytest.raises(ValueError, match=r"strategy.wrap='none' applies to strategy=nd without pipeline stages"):
        resolve_strategy("nd", pp=2, tp=2, wrap="none")
    with pytest.raises(ValueError, match=r"strategy.schedule='gpipe' is a pipeline setting"):
        resolve_strategy("nd", tp=2, schedule="gpipe")


def test_interleaved_schedule_eager_build_and_accumulation_equal_one_process(single, tmp_path):
    # 2 virtual stages per rank (rank pp 0 holds stages 0 and 2), each split over 2 tp ranks;
    # built eagerly (meta_init=false), then split: the same weights as the meta build's; each
    # optimizer step accumulates 2 of the loop's micro-batches of 8.
    strategy = PipelineStrategy(stages=2, tp=2, microbatches=2, schedule="interleaved_1f1b", partition="uniform",
                                meta_init=False)
    piped = run(tmp_path, strategy, devices=4, batch_size=GLOBAL_BATCH // 2, accumulate_grad_batches=2,
                gradient_clip_val=CLIP)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)


@pytest.mark.slow
def test_activation_checkpointing_and_compile_compose_with_tensor_parallel(tmp_path):
    # Both applied to the blocks before the stages are built; the plan then splits the compiled,
    # checkpointed blocks (the schedule traces them with DTensor weights).
    options = dict(activation_checkpointing=True, compile=True)
    single = run(tmp_path / "single", **options)
    piped = run(tmp_path / "pp", PipelineStrategy(stages=2, tp=2, microbatches=2, partition="uniform"), devices=4,
                **options)
    assert_same_training(piped, single, steps=STEPS, tol=TOL)


def test_checkpoint_resumes_bitwise_on_the_same_layout(tmp_path):
    # Sharded checkpoints (each stage's tensor-parallel pieces): resumed from step 10 in a new
    # run, the last 5 steps and the final parameters are the uninterrupted run's, bitwise.
    import subprocess
    import sys

    from tests.support.helpers import REPO
    from trainer.checkpoint import layout

    def strategy():
        return PipelineStrategy(stages=2, tp=2, microbatches=2, partition="uniform")

    whole_losses, whole_params = run(tmp_path / "whole", strategy(), devices=4,
                                     checkpoint=dict(every_n_steps=5, keep_last=None))
    committed = layout.committed_checkpoints(str(tmp_path / "whole" / "checkpoints"))
    assert [c.rsplit("-", 1)[1].lstrip("0") for c in committed] == ["5", "10", "15"]
    losses, params = run(tmp_path / "resumed", strategy(), devices=4, resume=committed[1],
                         checkpoint=dict(save_last=False))
    steps = {r["step"]: r["train/loss"] for r in read_metrics(str(tmp_path / "resumed")) if "train/loss" in r}
    assert sorted(steps) == list(range(11, STEPS + 1))
    assert [steps[s] for s in range(11, STEPS + 1)] == whole_losses[10:]
    assert params.keys() == whole_params.keys()
    for name, value in whole_params.items():
        assert torch.equal(params[name], value), name
    # The last checkpoint's tensor-parallel pieces consolidate into the full weights of one process.
    out = tmp_path / "model.pt"
    result = subprocess.run([sys.executable, "-m", "trainer.checkpoint", "consolidate", committed[-1], str(out)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    consolidated = torch.load(out, weights_only=True)
    assert consolidated.keys() == whole_params.keys()
    for name, value in whole_params.items():
        assert torch.equal(consolidated[name], value), name


def test_bad_layouts_are_refused_before_any_worker(tmp_path):
    from trainer import Trainer

    with pytest.raises(ValueError, match=r"strategy.stages=3 x strategy.tp=2 = 6 does not divide the world size 8"):
        Trainer(strategy=PipelineStrategy(stages=3, tp=2), devices=8, run_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"strategy.tp=3 does not divide the world size 4"):
        Trainer(strategy=PipelineStrategy(tp=3), devices=4, run_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"strategy.tp=0 must be an integer >= 1"):
        PipelineStrategy(tp=0)
    with pytest.raises(ValueError, match=r"strategy.dp_replicate=2 is for data_parallel=hsdp; with data_parallel=fsdp"):
        PipelineStrategy(data_parallel="fsdp", dp_replicate=2)
    with pytest.raises(ValueError, match=r"strategy.dp_replicate=None: data_parallel=hsdp needs"):
        PipelineStrategy(data_parallel="hsdp")
    with pytest.raises(ValueError, match=r"strategy.dp_replicate=4 does not divide the 2 replicas"):
        Trainer(strategy=PipelineStrategy(stages=2, tp=2, data_parallel="hsdp", dp_replicate=4), devices=8,
                run_dir=str(tmp_path))
    assert PipelineStrategy.data_parallel_of(dp_replicate=2, dp_shard=1) == {"data_parallel": "ddp"}
    assert PipelineStrategy.data_parallel_of(dp_replicate=1, dp_shard=4) == {"data_parallel": "fsdp"}
    # strategy=nd's resolved degrees -> the pipeline with the same mesh
    from trainer.strategies.parallel_dims import ParallelDims

    dims = ParallelDims.resolve(16, pp=2, dp_replicate=2, dp_shard=-1, tp=2)
    built = PipelineStrategy.from_dims(dims, microbatches=4, loss_parallel=False)
    assert (built.stages, built.tp, built.data_parallel, built.dp_replicate, built.microbatches, built.loss_parallel) == \
        (2, 2, "hsdp", 2, 4, False)
    assert built.data_parallel_size(16) == dims.dp == 4
    # ... or its degrees as given (-1: the rest), resolved when the Trainer knows the world size
    given = PipelineStrategy.from_degrees(pp=2, dp_replicate=2, dp_shard=-1, tp=2, microbatches=4)
    Trainer(strategy=given, devices=16, run_dir=str(tmp_path))
    assert (given.stages, given.tp, given.data_parallel, given.dp_replicate, given.data_parallel_size(16)) == \
        (2, 2, "hsdp", 2, 4)
    with pytest.raises(ValueError, match=r"the parallel degrees \(pp 3 x dp_shard -1 x tp 2\) do not divide the world size 8"):
        Trainer(strategy=PipelineStrategy.from_degrees(pp=3, tp=2), devices=8, run_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"strategy.cp=2: context parallel is not supported with pipeline stages"):
        PipelineStrategy.from_degrees(pp=2, cp=2)
    with pytest.raises(ValueError, match=r"strategy.stages comes from the parallel degrees here"):
        PipelineStrategy.from_degrees(pp=2, stages=2)
    # stages=null: the world / tp stages, no replicas
    assert PipelineStrategy(tp=2).data_parallel_size(8) == 1
    assert PipelineStrategy(stages=2, tp=2).data_parallel_size(8) == 2


class PlanAcrossLayers(TensorParallelRegressor):
    def tensor_parallel_plan(self):
        from torch.distributed.tensor.parallel import ColwiseParallel

        return {"blocks": ColwiseParallel()}  # the container of several pipeline layers


class PlanMissingSubmodule(TensorParallelRegressor):
    def tensor_parallel_plan(self):
        from torch.distributed.tensor.parallel import ColwiseParallel

        return {"blocks.*.upp": ColwiseParallel()}


def test_bad_plans_are_refused_before_any_worker():
    strategy = PipelineStrategy(stages=2, tp=2)
    strategy.check_module(TensorParallelRegressor())  # accepted
    with pytest.raises(ValueError, match=r"strategy.tp=2 needs BlockRegressor.tensor_parallel_plan\(\)"):
        strategy.check_module(BlockRegressor())
    with pytest.raises(ValueError, match=r"entry 'blocks' is not inside one of pipeline_layers\(\)"):
        strategy.check_module(PlanAcrossLayers())
    with pytest.raises(ValueError, match=r"names 'blocks.\*.upp', which is no submodule of the model; did you mean"):
        strategy.check_module(PlanMissingSubmodule())


@pytest.mark.slow
def test_two_stages_by_two_shards_by_two_tensor_parallel_ranks_equal_one_process(single, tmp_path):
    # 8 ranks: 2 stages x 2 replicas sharding each stage (FSDP2 over "dp") x 2 tensor-parallel
    # ranks (the blocks' parameters are 2-D DTensors: Shard over dp, and over tp where the plan splits).
    # Built as strategy=nd's pp 2 x dp_shard -1 x tp 2 maps to the pipeline.
    strategy = PipelineStrategy.from_degrees(pp=2, dp_shard=-1, tp=2, microbatches=2, partition="uniform")
    piped = run(tmp_path, strategy, devices=8, batch_size=GLOBAL_BATCH // 2, gradient_clip_val=CLIP)
    assert (strategy.stages, strategy.tp, strategy.data_parallel) == (2, 2, "fsdp")
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    torch.testing.assert_close(torch.tensor(logged(tmp_path, "train/grad_norm")),
                               torch.tensor(logged(single[1], "train/grad_norm")), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(logged(tmp_path, "val/loss")), torch.tensor(logged(single[1], "val/loss")), **TOL)


@pytest.mark.parametrize("recipe, normalization", [("gpt", "tokens"), ("llama", "samples")])
def test_recipe_two_stages_by_two_tensor_parallel_ranks_equal_one_process(tmp_path, recipe, normalization):
    # The recipe's own plan (sequence parallel between the blocks: the stages exchange each tp
    # rank's sequence shard; the head's logits vocabulary-sharded, the loss under loss_parallel),
    # cut by stage: the embedding and the first block on stage 0, the second block and the head
    # on stage 1. SGD with momentum, for the reason the recipes' plan tests give. gpt divides the
    # gradients by the global token count: the last stage's tp ranks must count their tokens once.
    from tests.multiprocess.recipes.test_tp_plans import GLOBAL_BATCH as BATCH, check_same_training, fit_recipe

    options = dict(batch_size=BATCH, loss_normalization=normalization)
    reference = fit_recipe(tmp_path / "single", recipe, **options)
    strategy = PipelineStrategy(stages=2, tp=2, microbatches=2, partition=[2])
    check_same_training(fit_recipe(tmp_path / "pp", recipe, strategy=strategy, devices=4, **options), reference)
    # The plan did split each stage: every rank holds about half of its stage (the norms whole).
    for fraction in held_fractions(tmp_path / "pp", ranks_per_stage=2):
        assert 0.45 < fraction < 0.55


@pytest.mark.slow
def test_two_stages_by_hybrid_sharded_replicas_equal_one_process(single, tmp_path):
    # 8 ranks: 2 stages x (2 copies x 2 shards) of each stage (FSDP2's hybrid sharding on the
    # mesh's dp_replicate x dp_shard), the layout strategy=nd's pp 2 x dp_replicate 2 x dp_shard 2 maps to.
    options = PipelineStrategy.data_parallel_of(dp_replicate=2, dp_shard=2)
    assert options == {"data_parallel": "hsdp", "dp_replicate": 2}
    strategy = PipelineStrategy(stages=2, microbatches=2, partition="uniform", **options)
    piped = run(tmp_path, strategy, devices=8, batch_size=GLOBAL_BATCH // 4, gradient_clip_val=CLIP)
    assert_same_training(piped, single[0], steps=STEPS, tol=TOL)
    # each stage sharded in halves (over dp_shard), each half held twice (over dp_replicate)
    for fraction in held_fractions(tmp_path, ranks_per_stage=4):
        assert 0.45 < fraction < 0.55
    torch.testing.assert_close(torch.tensor(logged(tmp_path, "train/grad_norm")),
                               torch.tensor(logged(single[1], "train/grad_norm")), rtol=1e-5, atol=0)
