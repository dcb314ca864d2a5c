"""Per-rank bytes of ``strategy=nd`` layouts (pp x dp_replicate x dp_shard x tp), and of ``strategy=pipeline``
with ``tp > 1``, from the dry run's shards.

The parameters, gradients and optimizer state are not formulas here: each rank's layout is built by
the dry run (trainer/estimate/dry_run.py: the plan applied over ``mesh["tp"]``, ``fully_shard`` over
the data-parallel dims, on the meta device and a fake process group) and its shards are counted:

- parameters: the local storage of each parameter (FSDP's padded shard; a TP-only tensor's local piece)
  x the weights' element size under the precision;
- gradients: the same storage for each trainable parameter (FSDP's gradients are views of the
  padded reduce-scatter output; TP-only gradients have the local shape, except an embedding split
  by rows: torch's backward gives it a Replicate gradient, the whole table on every tp rank, as
  measured) x the gradient element size;
- optimizer state: the unpadded local elements x the measured bytes per element, plus the bytes per
  tensor (trainer/estimate/optimizer_state.py), as ``zeros_like`` of the local shard allocates it;
- buffers: FSDP's all-gather / reduce-scatter buffers as in formulas.fsdp, per unit of this rank,
  gathered over dp_shard only (a unit's gathered tensor is still TP-sharded); a pipeline's ddp
  replicas: one flat copy of the stage's gradients (as formulas.pipeline_stages); TP's own
  communication buffers are transient and not counted.

Activations (a stated formula on the measured ones, trainer/estimate/activations.py, one micro-batch
of ``data.batch_size`` per data-parallel rank): tensor parallel with sequence parallel divides every
saved activation by ``tp`` (attention and MLP tensors are split by heads / hidden width, the norms'
and the residual stream's by sequence, the logits by vocabulary under loss parallel), so a rank
saves ``measured / tp``; a plan without sequence parallel keeps the norms' inputs whole, and the
figure is then a lower bound. With pp > 1 a rank saves its stage's layers' figures for the
micro-batches in flight, as the pipeline rows do (trainer/estimate/plan.py).
"""

from __future__ import annotations

from typing import Any, Callable

from trainer.estimate.activations import ActivationBytes
from trainer.estimate.dry_run import RankLayout, all_layouts, representative_ranks, rank_layout
from trainer.estimate.formulas import Bytes, RankBytes
from trainer.estimate.plan import Row, Setting, precision_bytes
from trainer.strategies.parallel_dims import ParallelDims

#: above this many distinct layouts, a row builds a sample (see ``sampled_layouts``): the configured
#: layout's row, and the comparison's rows (which show only the largest rank)
MAX_BUILDS = 64
MAX_COMPARISON_BUILDS = 8


def state_bytes(layout: RankLayout, b: Bytes, mode: str = "full", unsharded_grads: bool = False) -> RankBytes:
    """Parameters, gradients, optimizer state and FSDP buffers of one rank (see the module docstring).
    ``mode``: full (reshard after forward: two units gathered at a time) or grad_op (all of them)."""
    trained = [s for s in layout.shards if s.trainable]
    r = RankBytes(
        parameters=sum(s.storage_numel * b.param for s in layout.shards),
        gradients=sum(s.gradient_numel * b.grad for s in trained),
        optimizer=round(sum(s.local_numel * b.state_per_element + b.state_per_tensor for s in trained)),
    )
    if layout.fsdp_group > 1:
        gathered = [0] * layout.units
        grads = [0] * layout.units
        for s in layout.shards:
            gathered[s.unit] += s.storage_numel * layout.fsdp_group
            if s.trainable:
                grads[s.unit] += s.storage_numel * layout.fsdp_group
        held = sum(sorted(gathered)[-2:]) if mode == "full" else sum(gathered)
        r.buckets = held * b.gather + max(grads, default=0) * b.reduce
        if unsharded_grads:
            r.buckets += sum(grads) * b.gather
    return r


def activation_bytes(layout: RankLayout, acts: ActivationBytes | None, checkpointing: bool,
                     microbatches: int | None = None, schedule: str | None = None) -> int:
    """This rank's saved activations for one micro-batch (see the module docstring)."""
    if acts is None:
        return 0
    dims = layout.dims
    whole = acts.checkpointed if checkpointing else acts.total
    if dims.pp == 1 or not acts.per_layer:
        return round(whole / dims.tp)
    ratio = acts.checkpointed / acts.total if checkpointing and acts.total else 1.0
    microbatches = microbatches or dims.pp
    in_flight = microbatches if schedule == "gpipe" else min(microbatches, dims.pp - layout.coordinates["pp"])
    saved = sum(acts.per_layer[i] for first, last in layout.stage_layers for i in range(first, last + 1))
    return round(saved / microbatches * in_flight * ratio / dims.tp)


def sampled_layouts(make_module: Callable[[], Any], dims: ParallelDims, max_builds: int = MAX_BUILDS,
                    **options: Any) -> tuple[list[RankLayout], bool]:
    """Every rank's layout when at most ``max_builds`` distinct ones exist; else (``True``) the
    ranks at dp_shard and tp coordinates 0 and last of every stage: ``torch.chunk`` gives the first
    coordinates the largest pieces and the last ones the smallest, so the largest rank is among them."""
    if len(set(representative_ranks(dims).values())) <= max_builds:
        return all_layouts(make_module, dims, **options), False
    ranks = []
    for rank in range(dims.world_size):
        c = dims.coordinates(rank)
        if c["dp_replicate"] == 0 and c["cp"] == 0 and c["dp_shard"] in (0, dims.dp_shard - 1) \
                and c["tp"] in (0, dims.tp - 1):
            ranks.append(rank)
    return [rank_layout(make_module, dims, r, **options) for r in ranks], True


#: the pipeline schedules that run two stages per rank unless strategy.virtual_stages says otherwise
INTERLEAVED = ("interleaved_1f1b", "looped_bfs", "zero_bubble")


def layout_of(strategy: str, options: dict, world: int) -> tuple[ParallelDims, dict] | None:
    """The degrees and the dry run's options of a strategy node (``strategy.*``): strategy=nd, or
    strategy=pipeline with ``tp > 1`` (stages x replicas x tp); None for the others (the formulas
    count them). One-line ValueErrors for degrees that do not fit ``world``."""
    layout = {"wrap": options.get("wrap", "auto"), "min_num_params": options.get("min_num_params"),
              "partition": options.get("partition", "parameters"),
              "virtual_stages": options.get("virtual_stages") or (2 if options.get("schedule") in INTERLEAVED else 1)}
    if strategy == "nd":
        return dims_of(options, world), layout
    tp = options.get("tp") or 1
    if strategy != "pipeline" or tp == 1:
        return None
    from trainer.strategies.pipeline_groups import pipeline_dims

    stages = options.get("stages") or max(1, world // tp)
    if world % (stages * tp):
        raise ValueError(f"strategy.stages={stages} x strategy.tp={tp} do not divide the world size {world}")
    data_parallel = options.get("data_parallel", "ddp")
    return pipeline_dims(stages, world // (stages * tp), tp, data_parallel), {**layout, "data_parallel": data_parallel}


def dims_of(options: dict, world: int) -> ParallelDims:
    """The degrees of a strategy=nd node, resolved against ``world`` (ParallelDims' one-line errors)."""
    return ParallelDims.resolve(world, **{k: options[k] for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")
                                          if options.get(k) is not None})


def nd_row(name: str, make_module: Callable[[], Any], dims: ParallelDims, shapes: Any, acts: ActivationBytes | None,
           setting: Setting, options: dict | None = None, max_builds: int = MAX_BUILDS,
           gathered: ActivationBytes | None = None, layout: dict | None = None) -> Row:
    """One row: every rank of the ``dims`` layout (a sample of them past ``max_builds`` layouts,
    said in the note), its options the strategy node's (wrap, partition, microbatches, dtypes ...).
    ``gathered``: the activations with the weights in the compute dtype (mixed precision), used when
    FSDP gathers them so (a data-parallel dimension); else ``acts``, autocast's casts included.
    ``layout``: the dry run's options (`layout_of`; default strategy=nd's from ``options``)."""
    options = options or {}
    layout = layout or {"wrap": options.get("wrap", "auto"), "min_num_params": options.get("min_num_params")}
    fsdp = dims.dp > 1 and layout.get("data_parallel", "fsdp") == "fsdp"
    acts = gathered if gathered is not None and fsdp else acts
    b = precision_bytes(shapes, setting.precision, options)
    layouts, sampled = sampled_layouts(make_module, dims, max_builds, **layout)
    unsharded = setting.accumulate_grad_batches > 1 and not options.get("sync_every_microbatch")
    ranks = []
    for built in layouts:
        r = state_bytes(built, b, "full", unsharded)
        if dims.dp > 1 and not fsdp:  # the pipeline's replicas: one flat all-reduce of the stage's gradients
            r.buckets = r.gradients
        r.activations = activation_bytes(built, acts, setting.activation_checkpointing, options.get("microbatches"),
                                         options.get("schedule"))
        ranks.append(r)
    detail = " x ".join(f"{n} {getattr(dims, n)}" for n in ("pp", "dp_replicate", "dp_shard", "tp") if getattr(dims, n) > 1)
    notes = [f"activations / tp {dims.tp} (sequence parallel splits them)"] if acts is not None and dims.tp > 1 else []
    if sampled:
        notes.append(f"{len(layouts)} ranks built (dp_shard and tp coordinates 0 and last of each stage), not all "
                     f"{dims.world_size}")
    note = "; ".join(notes)
    return Row(name, ranks, detail or "one rank", note)


def tp_degree(module: Any, world: int, devices_per_node: int) -> int | None:
    """The comparison's TP degree: the largest > 1 dividing the world, within a node, that the module
    accepts (``check_tensor_parallel``); None when the module declares no plan or accepts none."""
    from trainer.strategies.tensor_parallel import module_plan

    if module_plan(module) is None:
        return None
    for tp in range(min(world, devices_per_node), 1, -1):
        if world % tp:
            continue
        try:
            module.check_tensor_parallel(tp)
        except ValueError:
            continue
        return tp
    return None


def comparison_rows(module: Any, make_module: Callable[[], Any], shapes: Any, acts: ActivationBytes | None,
                    setting: Setting, gathered: ActivationBytes | None = None) -> list[Row]:
    """The nd rows of the comparison when the module declares a TP plan: FSDP x TP within a node (TP
    alone when it fills the world) and, with pipeline layers and more than one node, pp (one stage
    per node) x FSDP x TP."""
    tp = tp_degree(module, setting.world, setting.devices_per_node)
    if tp is None:
        return []
    world = setting.world
    dims = ParallelDims.resolve(world, dp_shard=-1, tp=tp)
    rows = [nd_row("nd tp" if dims.dp == 1 else "nd fsdp x tp", make_module, dims, shapes, acts, setting,
                   max_builds=MAX_COMPARISON_BUILDS, gathered=gathered)]
    pp = world // setting.devices_per_node
    if shapes.layers and pp > 1 and pp <= len(shapes.layers) and world // (pp * tp) > 1:
        rows.append(nd_row("nd pp x fsdp x tp", make_module, ParallelDims.resolve(world, pp=pp, dp_shard=-1, tp=tp),
                           shapes, acts, setting, max_builds=MAX_COMPARISON_BUILDS, gathered=gathered))
    return rows
