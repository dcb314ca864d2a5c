"""Per-rank bytes of every strategy for one model, precision and world: the rows of the table.

``strategy_rows`` applies trainer/estimate/formulas.py to the model's shapes for single, DDP,
ZeRO-1, FSDP grad_op / full / hybrid (and full with CPU offload), pipeline and pipeline x FSDP;
``configured_row`` to the strategy the config selects, with its options. Activations come from
trainer/estimate/activations.py (one micro-batch of ``data.batch_size`` per rank).

Pipeline activations (a stated formula): a pipeline microbatch is ``batch_size / microbatches``
samples and saves its layers' measured bytes scaled by that fraction; under 1F1B (and the
interleaved schedules, approximated as 1F1B) stage ``s`` of ``S`` holds ``min(microbatches, S - s)``
microbatches in flight, under GPipe all ``microbatches``. With activation checkpointing the stage
figure is scaled by the whole model's checkpointed / plain ratio.

Mixed precision: autocast keeps the low-precision copy of each weight it casts for backward, so
the activations measured with fp32 weights hold a bf16 / fp16 copy of the weights (single, DDP,
ZeRO-1, pipeline). FSDP gathers its weights already in ``param_dtype``, where the cast is a no-op
and the gathered weights are its communication buffers: its rows use ``gathered`` activations,
measured with the weights in the compute dtype (None: the same as ``acts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from trainer.estimate import formulas
from trainer.estimate.activations import ActivationBytes
from trainer.estimate.formulas import Bytes, RankBytes
from trainer.estimate.model import ModelShapes, stage_bounds

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass
class Setting:
    """The run being planned: world, precision, micro-batch and the configured strategy."""

    world: int
    devices_per_node: int
    precision: str = "fp32"
    batch_size: int = 1
    activation_checkpointing: bool = False
    accumulate_grad_batches: int = 1  # micro-batches per optimizer step (FSDP keeps unsharded gradients between)
    strategy: str = "single"
    options: dict = field(default_factory=dict)  # the strategy node's keys (its yaml's defaults included)


@dataclass
class Row:
    """One strategy: the bytes of each rank (pipeline: each stage's first replica)."""

    name: str
    ranks: list[RankBytes]
    detail: str = ""  # the layout, short (a table column)
    note: str = ""  # more, printed under the table

    @property
    def worst(self) -> RankBytes:
        return max(self.ranks, key=lambda r: r.total)


def precision_bytes(shapes: ModelShapes, precision: str, options: dict | None = None) -> Bytes:
    """Element sizes under ``precision`` (trainer/precision: mixed modes keep fp32 weights and
    gradients and autocast from them; bf16-true converts the module) and the optimizer's state size
    for weights of that dtype (measured). FSDP's gather / reduce dtypes: ``param_dtype`` /
    ``reduce_dtype`` when set, else the compute dtype / fp32 under mixed precision."""
    from trainer.estimate.optimizer_state import optimizer_state_size

    options = options or {}
    weights = torch.bfloat16 if precision == "bf16-true" else torch.float32
    size = 2 if precision == "bf16-true" else 4
    sizes = {optimizer_state_size(factory, weights) for factory in shapes.optimizer_factories}
    if len(sizes) > 1:
        raise ValueError(f"the module's optimizers keep state of different sizes {sorted(sizes)} (bytes per element, "
                         "per tensor): the estimator takes one size for every parameter")
    per_element, per_tensor = sizes.pop()
    gather = DTYPE_BYTES[options["param_dtype"]] if options.get("param_dtype") else (2 if precision != "fp32" else size)
    reduce_default = 4 if precision.endswith("-mixed") else gather
    reduce = DTYPE_BYTES[options["reduce_dtype"]] if options.get("reduce_dtype") else reduce_default
    return Bytes(param=size, grad=size, state_per_element=per_element, state_per_tensor=per_tensor,
                 gather=gather, reduce=reduce)


def _with_activations(ranks: list[RankBytes], activations: int) -> list[RankBytes]:
    return [replace(r, activations=activations) for r in ranks]


def _pipeline_row(name: str, shapes: ModelShapes, acts: ActivationBytes | None, setting: Setting, b: Bytes,
                  stages: int, data_parallel: str, options: dict) -> Row:
    virtual = options.get("virtual_stages") or (2 if options.get("schedule") in ("interleaved_1f1b", "looped_bfs",
                                                                                 "zero_bubble") else 1)
    parts = stages * virtual
    bounds = stage_bounds(shapes.layers, parts, options.get("partition", "parameters"))
    replicas = setting.world // stages
    per_stage = formulas.pipeline_stages(shapes.layers, bounds, b, replicas, data_parallel)
    microbatches = options.get("microbatches") or stages
    ratio = (acts.checkpointed / acts.total if acts and acts.total and setting.activation_checkpointing else 1.0)
    ranks = []
    for pp_rank in range(stages):  # a rank runs stages pp_rank, pp_rank + stages, ... (interleaved)
        mine = [s for s in range(parts) if s % stages == pp_rank]
        total = RankBytes()
        for s in mine:
            worst = max(per_stage[s], key=lambda r: r.total)
            for key in ("parameters", "gradients", "optimizer", "buckets"):
                setattr(total, key, getattr(total, key) + getattr(worst, key))
        if acts is not None and acts.per_layer:
            in_flight = microbatches if options.get("schedule") == "gpipe" else min(microbatches, stages - pp_rank)
            saved = sum(acts.per_layer[i] for s in mine for i in range(bounds[s], bounds[s + 1]))
            total.activations = round(saved / microbatches * in_flight * ratio)
        ranks.append(total)
    spans = [f"{bounds[s]}-{bounds[s + 1] - 1}" for s in range(parts)]
    note = "layers per stage " + ", ".join(spans[:4]) + (f", ... ({parts} stages)" if parts > 4 else "")
    if setting.batch_size % microbatches:  # the strategy refuses this; say so rather than print a figure silently
        note += (f"; strategy.microbatches={microbatches} does not divide data.batch_size={setting.batch_size}: "
                 "the trainer refuses this layout (activations prorated)")
    return Row(name, ranks, f"{stages} stages x {replicas} {data_parallel}", note)


def _per_rank(acts: ActivationBytes | None, setting: Setting) -> int:
    return 0 if acts is None else (acts.checkpointed if setting.activation_checkpointing else acts.total)


def strategy_rows(module: Any, shapes: ModelShapes, acts: ActivationBytes | None, setting: Setting,
                  gathered: ActivationBytes | None = None) -> list[Row]:
    """The comparison table: every strategy under the configured precision."""
    b = precision_bytes(shapes, setting.precision)
    act, sharded_act = _per_rank(acts, setting), _per_rank(gathered or acts, setting)
    world = setting.world
    units = shapes.fsdp_units(module)
    hybrid = min(setting.devices_per_node, world)
    accumulating = setting.accumulate_grad_batches > 1  # FSDP's default: no reduce-scatter until the last micro-batch
    rows = [
        Row("single", _with_activations([formulas.replicated(shapes.parameters, b)], act), "1 device"),
        Row("ddp", _with_activations(formulas.ddp(shapes.parameters, b, world), act), f"{world} replicas"),
        Row("ddp zero1", _with_activations(formulas.zero1(shapes.groups, b, world), act),
            f"optimizer state over {world} ranks",
            "" if len(shapes.optimizer_factories) == 1 else
            f"the trainer refuses strategy.zero1=true with {len(shapes.optimizer_factories)} optimizers"),
        Row("fsdp grad_op", _with_activations(formulas.fsdp(units, b, world, "grad_op", False, accumulating),
                                              sharded_act), f"{world} shards"),
        Row("fsdp full", _with_activations(formulas.fsdp(units, b, world, "full", False, accumulating), sharded_act),
            f"{world} shards"),
        Row("fsdp hybrid", _with_activations(formulas.fsdp(units, b, hybrid, "full", False, accumulating), sharded_act),
            f"{hybrid} shards x {world // hybrid} replicas"),
        Row("fsdp full + offload", _with_activations(formulas.fsdp(units, b, world, "full", True, accumulating),
                                                     sharded_act),
            "state in host memory (needs CUDA)"),
    ]
    if shapes.layers:
        stages = min(world, len(shapes.layers))
        rows.append(_pipeline_row("pipeline", shapes, acts, setting, b, stages, "ddp", {}))
        pp = setting.world // setting.devices_per_node if setting.world > setting.devices_per_node else 2
        if world % pp == 0 and world // pp > 1 and pp <= len(shapes.layers):
            rows.append(_pipeline_row("pipeline x fsdp", shapes, gathered or acts, setting, b, pp, "fsdp", {}))
    return rows


def configured_row(module: Any, shapes: ModelShapes, acts: ActivationBytes | None, setting: Setting,
                   gathered: ActivationBytes | None = None) -> Row:
    """The strategy the config selects, with its own options (sharding, shard_size, wrap, offload,
    bucket views, pipeline stages / schedule / microbatches / partition / data_parallel)."""
    o, world, name = setting.options, setting.world, setting.strategy
    b = precision_bytes(shapes, setting.precision, o if name == "fsdp" else None)
    act = _per_rank(acts, setting)
    view = o.get("gradient_as_bucket_view", True)
    if name == "single":
        return Row("single", _with_activations([formulas.replicated(shapes.parameters, b)], act))
    if name == "ddp":
        ranks = (formulas.zero1(shapes.groups, b, world, view) if o.get("zero1")
                 else formulas.ddp(shapes.parameters, b, world, view))
        return Row("ddp zero1" if o.get("zero1") else "ddp", _with_activations(ranks, act))
    if name == "fsdp":
        sharding = o.get("sharding", "full")
        shards = {"no_shard": 1, "hybrid": o.get("shard_size") or min(setting.devices_per_node, world)}.get(sharding, world)
        units = shapes.fsdp_units(module, o.get("wrap", "auto"), o.get("min_num_params"))
        unsharded = setting.accumulate_grad_batches > 1 and not o.get("sync_every_microbatch")
        group = formulas.fsdp(units, b, shards, "grad_op" if sharding == "grad_op" else "full", bool(o.get("cpu_offload")),
                              unsharded)
        ranks = group * (world // shards)  # the (replicate, shard) mesh: rank = replica x shards + shard
        act = _per_rank(gathered or acts, setting)
        return Row(f"fsdp {sharding}" + (" + offload" if o.get("cpu_offload") else ""), _with_activations(ranks, act),
                   f"{shards} shards")
    if name == "pipeline":
        if not shapes.layers:
            raise ValueError(f"strategy=pipeline: {type(module).__name__}.pipeline_layers() returns no layers")
        stages = o.get("stages") or world
        fsdp_stages = o.get("data_parallel") == "fsdp" and stages < world
        return _pipeline_row("pipeline", shapes, (gathered or acts) if fsdp_stages else acts, setting, b, stages,
                             o.get("data_parallel", "ddp"), o)
    raise ValueError(f"strategy={name!r}: the estimator knows single, ddp, fsdp and pipeline")
