"""The dry run (trainer/estimate/dry_run.py): one rank of a large N-D layout laid out in this process on
torch's fake process group, with the module on the meta device.

A 64-rank 3D layout of the llama recipe (pp 4 x dp_shard 4 x tp 4) is built rank by rank for one
pipeline stage: every local shape is the global one cut by torch.chunk over tp (the plan's dim) and
then over dp_shard (dim 0), and a parameter's pieces over the stage's 16 ranks add up to the whole
parameter (tp times it for one the plan leaves whole). Bad layouts are one line.
"""

import math

import pytest
from hydra.utils import instantiate

from tests.support.tp_modules import TPRegressor
from trainer.cli.command import main as command_main
from trainer.estimate.dry_run import rank_layout, representative_ranks
from trainer.estimate.dry_run_command import compose
from trainer.estimate.formulas import chunk_rows
from trainer.estimate.nd_plan import dims_of
from trainer.estimate.table import human
from trainer.strategies.parallel_dims import ParallelDims

DIMS = ParallelDims.resolve(64, pp=4, dp_shard=4, tp=4)


@pytest.fixture(scope="module")
def make_llama():
    # 6 blocks = 8 pipeline layers (embedding, blocks, norm + output): 2 per stage; tp 4 needs 4 kv heads.
    cfg = compose(["recipe=llama", "module.layers=6", "module.kv_heads=4"])
    return lambda: instantiate(cfg.module)


@pytest.fixture(scope="module")
def stage0(make_llama):
    """Every rank of pipeline stage 0 (pp coordinate 0: ranks 0..15), by rank."""
    return {rank: rank_layout(make_llama, DIMS, rank) for rank in range(16)}


#: the dim the recipe's plan splits over tp (recipes/llama.py): ColwiseParallel the output
#: rows (q, k, v, w1, w3, the vocabulary head), RowwiseParallel the input columns (wo, w2) and an
#: embedding's vocabulary rows; the norms are sequence-parallel: whole weights on every tp rank.
TP_DIM = {"tok_embeddings": 0, "wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1,
          "attention_norm": None, "ffn_norm": None, "norm": None}


def _tp_dim(name: str) -> int | None:
    return TP_DIM[name.split(".")[-2]]


def _expected_local(global_shape, tp_dim, tp_coord, dp_coord, tp, dp):
    shape = list(global_shape)
    if tp_dim is not None:
        shape[tp_dim] = chunk_rows(shape[tp_dim], tp, tp_coord)
    shape[0] = chunk_rows(shape[0], dp, dp_coord)
    return tuple(shape)


def test_rank_0_of_a_64_rank_3d_llama_layout_holds_its_stage_cut_by_tp_then_dp(stage0):
    layout = stage0[0]
    assert layout.coordinates == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0}
    assert layout.stages == [0] and layout.stage_layers == [(0, 1)] and layout.layer_count == 8
    names = [s.name for s in layout.shards]
    assert names[0] == "model.tok_embeddings.weight" and all(n.startswith("model.layers.0.") for n in names[1:])
    assert len(names) == 10  # the embedding and the first block's 9 weights: nothing of the other stages
    by_name = {s.name: s for s in layout.shards}
    assert by_name["model.tok_embeddings.weight"].global_shape == (256, 128)
    assert by_name["model.tok_embeddings.weight"].local_shape == (16, 128)  # 256 / tp 4 / dp_shard 4
    assert by_name["model.layers.0.attention.wo.weight"].local_shape == (32, 32)  # columns / tp, rows / dp
    assert by_name["model.layers.0.attention_norm.weight"].local_shape == (32,)  # whole over tp, / dp
    assert "tp: S(1)" in by_name["model.layers.0.attention.wo.weight"].placements
    assert "tp: R" in by_name["model.layers.0.attention_norm.weight"].placements  # sequence parallel


def test_the_last_rank_holds_the_last_stage(make_llama):
    layout = rank_layout(make_llama, DIMS, 63)
    assert layout.stages == [3] and layout.stage_layers == [(6, 7)]
    by_name = {s.name: s for s in layout.shards}
    assert sorted(by_name)[-2:] == ["model.norm.weight", "model.output.weight"]
    assert by_name["model.output.weight"].local_shape == (16, 128)  # 256 vocabulary rows / tp 4 / dp_shard 4
    assert all(n.startswith("model.layers.5.") for n in sorted(by_name)[:-2])


def test_every_local_shape_is_the_global_one_cut_by_torch_chunk(stage0):
    for rank, layout in stage0.items():
        c = layout.coordinates
        for s in layout.shards:
            want = _expected_local(s.global_shape, _tp_dim(s.name), c["tp"], c["dp_shard"], DIMS.tp, DIMS.dp_shard)
            assert s.local_shape == want, (rank, s.name, s.local_shape, want)
            # FSDP's storage: dim 0 padded to ceil(rows / dp_shard) of the tp piece
            tp_rows = s.global_shape[0] if _tp_dim(s.name) != 0 else chunk_rows(s.global_shape[0], DIMS.tp, c["tp"])
            assert s.storage_numel == -(-tp_rows // DIMS.dp_shard) * math.prod(want[1:]), (rank, s.name)


def test_a_parameters_pieces_over_the_stage_add_up_to_the_whole(stage0):
    pieces: dict[str, int] = {}
    for layout in stage0.values():
        for s in layout.shards:
            pieces[s.name] = pieces.get(s.name, 0) + s.local_numel * s.element_size
    for s in stage0[0].shards:
        copies = 1 if "tp: S(" in s.placements else DIMS.tp  # a piece per tp rank, or a whole copy on each
        assert pieces[s.name] == s.global_numel * s.element_size * copies, s.name


def test_replicas_hold_the_same_and_are_built_once():
    dims = ParallelDims.resolve(16, dp_replicate=2, dp_shard=2, tp=2, pp=2)
    rep = representative_ranks(dims)
    assert len(set(rep.values())) == 8
    for rank, same in rep.items():
        a, b = dims.coordinates(rank), dims.coordinates(same)
        assert b["dp_replicate"] == 0 and {k: v for k, v in a.items() if k != "dp_replicate"} == \
            {k: v for k, v in b.items() if k != "dp_replicate"}


def test_tp_only_and_fsdp_x_tp_shards_of_a_small_module():
    make = lambda: TPRegressor(width=6, hidden=10, depth=2)  # noqa: E731
    tp2 = rank_layout(make, ParallelDims.resolve(2, tp=2), 1)
    up = {s.name: s for s in tp2.shards}["blocks.0.up.weight"]
    assert (up.global_shape, up.local_shape, up.storage_numel) == ((10, 6), (5, 6), 30)
    inp = {s.name: s for s in tp2.shards}["inp.weight"]
    assert inp.local_shape == (6, 6) and inp.placements == ""  # outside the plan, no FSDP: a plain tensor
    two_d = rank_layout(make, ParallelDims.resolve(4, dp_shard=2, tp=2), 3)  # dp_shard 1, tp 1
    up = {s.name: s for s in two_d.shards}["blocks.0.up.weight"]
    assert (up.local_shape, up.storage_numel) == ((2, 6), 18)  # 5 rows: 3 + 2, padded to 3


def test_bad_layouts_are_one_line(make_llama):
    with pytest.raises(ValueError, match=r"multiply to 64, not to the world size 48") as error:
        dims_of({"pp": 4, "dp_shard": 4, "tp": 4}, 48)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"strategy.tp=4 must divide module.heads=4, module.kv_heads=2"):
        rank_layout(lambda: instantiate(compose(["recipe=llama"]).module), DIMS, 0)  # the recipe's 2 kv heads
    with pytest.raises(ValueError, match=r"dry_run.rank=64 is not a rank of the 64-rank layout"):
        rank_layout(make_llama, DIMS, 64)
    with pytest.raises(ValueError, match=r"strategy.tp=2: Regressor declares no tensor_parallel_plan"):
        from tests.support.helpers import Regressor

        rank_layout(lambda: Regressor(), ParallelDims.resolve(2, tp=2), 0)
    with pytest.raises(ValueError, match=r"hidden=10 is not divisible by tp=4"):
        rank_layout(lambda: TPRegressor(), ParallelDims.resolve(4, tp=4), 0)
    with pytest.raises(ValueError, match=r"strategy.pp=2: NoLayers.pipeline_layers\(\) returns no layers"):
        class NoLayers(TPRegressor):
            def pipeline_layers(self):
                return None
        rank_layout(lambda: NoLayers(), ParallelDims.resolve(2, pp=2), 0)


def test_a_plan_naming_a_missing_submodule_is_refused():
    class Typo(TPRegressor):
        def tensor_parallel_plan(self):
            return {"blocks.*.upp": dict(TPRegressor.tensor_parallel_plan(self))["blocks.*.up"]}

    with pytest.raises(ValueError, match=r"names 'blocks.\*.upp', which is no submodule"):
        rank_layout(lambda: Typo(), ParallelDims.resolve(2, tp=2), 0)


# ----- the command ---------------------------------------------------------------------------------------------
LLAMA_3D = ["recipe=llama", "module.kv_heads=4", "strategy=nd", "strategy.pp=4", "strategy.dp_shard=4",
            "strategy.tp=4", "trainer.devices=64"]


def test_trainer_dry_run_prints_rank_0s_shards_and_memory(capsys):
    assert command_main(["dry-run", *LLAMA_3D]) == 0
    out = capsys.readouterr().out
    assert "dry run of LlamaModule on pp 4 x dp_shard 4 x tp 4 = 64 ranks" in out
    assert "rank 0 (pp 0 of 4, dp_shard 0 of 4, tp 0 of 4); pipeline stage 0 (layer 0) of 4 stages over 4 layers" in out
    line = next(l for l in out.splitlines() if l.startswith("model.tok_embeddings.weight"))
    assert line.split()[1:8] == ["256", "x", "128", "->", "16", "x", "128"] and "8.00 KiB" in line
    table = out.split("estimated memory of rank 0")[1].splitlines()
    assert table[-1].split()[:3] == ["rank", "0", "8.00"]  # 16 x 128 fp32 weights = 8 KiB


def test_another_rank_is_chosen_with_dry_run_rank(capsys):
    assert command_main(["dry-run", *LLAMA_3D, "dry_run.rank=63", "dry_run.activations=false"]) == 0
    out = capsys.readouterr().out
    assert "rank 63 (pp 3 of 4, dp_shard 3 of 4, tp 3 of 4); pipeline stage 3 (layer 3)" in out
    assert "model.output.weight" in out and "model.tok_embeddings.weight" not in out


@pytest.mark.parametrize("overrides, message", [
    (["strategy.tp=8"], "the parallel degrees (pp 4 x dp_shard 4 x tp 8) multiply to 128, not to the world size 64"),
    (["module.kv_heads=2"], "strategy.tp=4 must divide module.heads=4, module.kv_heads=2"),
    (["dry_run.rank=64"], "dry_run.rank=64 is not a rank of the 64-rank layout"),
    (["dry_run.rnak=1"], "dry_run.rnak"),
    (["strategy=fsdp"], "strategy=fsdp: the dry run lays out strategy=nd"),
    (["strategy=pipeline"], "strategy=pipeline (tp 1): the dry run lays out strategy=nd"),
    (["strategy=pipeline", "strategy.stages=3", "strategy.tp=2"], "strategy.stages=3 x strategy.tp=2 do not divide the world size 64"),
])
def test_a_bad_layout_or_setting_is_one_line_and_exit_2(capsys, overrides, message):
    argv = [*LLAMA_3D, *overrides] if not overrides[0].startswith("strategy=") else \
        ["recipe=llama", "module.kv_heads=4", "trainer.devices=64", *overrides]
    assert command_main(["dry-run", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_a_pipeline_with_tensor_parallel_is_laid_out_as_its_stages_x_replicas_x_tp(capsys):
    argv = ["recipe=llama", "strategy=pipeline", "strategy.stages=2", "strategy.tp=2", "strategy.data_parallel=fsdp",
            "trainer.devices=8", "dry_run.rank=7", "dry_run.activations=false"]
    assert command_main(["dry-run", *argv]) == 0
    out = capsys.readouterr().out
    assert "on pp 2 x dp_shard 2 x tp 2 = 8 ranks" in out and "pipeline stage 1 (layers 2-3) of 2 stages" in out
    line = next(l for l in out.splitlines() if l.startswith("model.layers.1.attention.wq.weight"))
    assert line.split()[1:8] == ["128", "x", "128", "->", "32", "x", "128"]  # / tp 2 / dp_shard 2
    assert command_main(["dry-run", *argv, "strategy.data_parallel=ddp"]) == 0
    out = capsys.readouterr().out  # ddp replicas: whole stages, split by tp only
    assert "pp 2 x dp_replicate 2 x tp 2" in out
    line = next(l for l in out.splitlines() if l.startswith("model.layers.1.attention.wq.weight"))
    assert line.split()[1:8] == ["128", "x", "128", "->", "64", "x", "128"]


# ----- the estimator's nd rows -----------------------------------------------------------------------------------
def test_activations_divide_by_tp_and_follow_the_pipeline():
    from trainer.estimate.activations import ActivationBytes
    from trainer.estimate.dry_run import RankLayout
    from trainer.estimate.nd_plan import activation_bytes

    acts = ActivationBytes(batch_size=4, total=1200, outside_blocks=200, block_saved=[500, 500], block_inputs=[50, 50],
                           per_layer=[100, 500, 500, 100])
    flat = RankLayout(0, ParallelDims.resolve(4, dp_shard=2, tp=2), ParallelDims.resolve(4, dp_shard=2, tp=2).coordinates(0),
                      "M", [])
    assert activation_bytes(flat, acts, False) == 600 and activation_bytes(flat, acts, True) == (200 + 100 + 500) // 2
    dims = ParallelDims.resolve(4, pp=2, tp=2)
    first = RankLayout(0, dims, dims.coordinates(0), "M", [], stages=[0], stage_layers=[(0, 1)])
    last = RankLayout(3, dims, dims.coordinates(3), "M", [], stages=[1], stage_layers=[(2, 3)])
    # 1F1B, 2 micro-batches of half the batch: stage 0 holds 2 in flight, stage 1 one; then / tp 2
    assert activation_bytes(first, acts, False) == 600 * 2 / 2 / 2
    assert activation_bytes(last, acts, False) == 600 * 1 / 2 / 2
    assert activation_bytes(first, acts, False, schedule="gpipe", microbatches=4) == 600 / 2


def test_the_comparison_has_nd_rows_for_a_module_with_a_plan_only():
    from trainer.estimate.__main__ import compose as compose_estimate
    from trainer.estimate import estimate_config

    llama = estimate_config(compose_estimate(["recipe=llama", "trainer.devices=4", "trainer.num_nodes=2",
                                              "estimate.activations=false"]))
    rows = {line.split("  ")[0].strip(): line for line in llama.split("all strategies")[1].splitlines()}
    assert rows["nd fsdp x tp"].endswith("dp_shard 4 x tp 2")  # tp 4 would split the 2 kv heads
    assert rows["nd pp x fsdp x tp"].endswith("pp 2 x dp_shard 2 x tp 2")
    mlp = estimate_config(compose_estimate(["recipe=mlp", "trainer.devices=4", "estimate.activations=false"]))
    assert "nd " not in mlp


def test_the_estimator_counts_a_configured_nd_layout_from_its_shards():
    from trainer.estimate.__main__ import compose as compose_estimate
    from trainer.estimate import estimate_config

    out = estimate_config(compose_estimate(["recipe=llama", "strategy=nd", "strategy.tp=2", "trainer.devices=4",
                                            "estimate.activations=false"]))
    assert "configured: nd (dp_shard 2 x tp 2)" in out
    layouts = [rank_layout(lambda: instantiate(compose(["recipe=llama"]).module), ParallelDims.resolve(4, dp_shard=2, tp=2), r)
               for r in range(4)]
    configured = out.split("configured: nd")[1].split("all strategies")[0]
    # every rank the same here: 4 x 8 x ... rows split evenly; the printed parameters are the shards' storage
    assert len({sum(s.bytes for s in layout.shards) for layout in layouts}) == 1
    assert human(layouts[0].parameter_bytes) in configured.splitlines()[3]


def test_a_configure_model_that_splits_and_shards_itself_is_laid_out_as_it_does_it():
    # Lightning's way (self.device_mesh in configure_model): the same shards as the declared plan's.
    from tests.support.nd_modules import LightningWayClassifier, TokenClassifier

    dims = ParallelDims.resolve(4, dp_shard=2, tp=2)
    for rank in range(4):
        declared = rank_layout(lambda: TokenClassifier(), dims, rank)
        own = rank_layout(lambda: LightningWayClassifier(shard=True), dims, rank)
        assert [(s.name, s.local_shape, s.storage_numel) for s in own.shards] == \
            [(s.name, s.local_shape, s.storage_numel) for s in declared.shards], rank
        assert any(s.local_shape != s.global_shape for s in own.shards)


def test_hsdp_replicas_hold_what_one_replicas_shards_hold():
    make = lambda: TPRegressor(width=6, hidden=10, depth=2)  # noqa: E731
    hsdp = ParallelDims.resolve(8, dp_replicate=2, dp_shard=2, tp=2)
    flat = ParallelDims.resolve(4, dp_shard=2, tp=2)
    for rank in (1, 5):  # dp_replicate 0 and 1, dp_shard 0, tp 1
        layout = rank_layout(make, hsdp, rank)
        one = rank_layout(make, flat, 1)
        assert [(s.name, s.local_shape, s.storage_numel) for s in layout.shards] == \
            [(s.name, s.local_shape, s.storage_numel) for s in one.shards]
        up = {s.name: s for s in layout.shards}["blocks.0.up.weight"]
        assert up.placements.startswith("dp_replicate: R, dp_shard: ") and up.placements.endswith("tp: S(0)")


def test_nd_without_tp_counts_what_the_fsdp_formulas_count():
    # Two methods, one answer: the shards of strategy=nd with tp 1 (FSDP2 over dp_shard) against
    # trainer/estimate/formulas.py's fsdp full, on a module whose sizes pad (13 rows over 2 and 4).
    from tests.support.estimate_worker import MeasuredRegressor
    from trainer.estimate.model import build_fake, fake_mode, model_shapes
    from trainer.estimate.nd_plan import nd_row
    from trainer.estimate.plan import Setting, configured_row

    make = lambda: MeasuredRegressor(width=13, depth=3)  # noqa: E731
    mode = fake_mode()
    module = build_fake(make, mode)
    shapes = model_shapes(module, mode)
    for world in (2, 4):
        setting = Setting(world=world, devices_per_node=world, strategy="fsdp", options={"sharding": "full"})
        fsdp = configured_row(module, shapes, None, setting).ranks
        nd = nd_row("nd", make, ParallelDims.resolve(world, dp_shard=world), shapes, None, setting).ranks
        assert nd == fsdp, world
