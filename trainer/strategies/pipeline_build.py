"""Building this rank's pipeline stages (``PipelineStrategy.wrap``): cut the module's layers,
materialise (meta build) or move only this rank's stages, split them over the tensor-parallel
ranks (``tp``: pipeline_tp.py), shard them over the replicas (``data_parallel=fsdp`` / ``hsdp``),
delete the other stages' tensors from the module (module surgery), and
create torch's ``PipelineStage`` objects and the schedule."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch import nn

from trainer.runtime import distributed
from trainer.strategies.pipeline_partition import Stage, check_layers_cover_parameters, partition_layers
from trainer.strategies.pipeline_tp import parallelize_unit, stage_plans
from trainer.strategies.weight_init import WeightInit, has_meta_tensors

if TYPE_CHECKING:
    from trainer.strategies.pipeline import PipelineStrategy

log = logging.getLogger("trainer.strategies.pipeline")

#: schedule name -> (class name in torch.distributed.pipelining.schedules, several stages per rank)
SCHEDULES = {
    "gpipe": ("ScheduleGPipe", False),
    "1f1b": ("Schedule1F1B", False),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", True),
    "looped_bfs": ("ScheduleLoopedBFS", True),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", True),
}


def build_stages(strategy: PipelineStrategy, module: nn.Module, init: WeightInit | None) -> nn.Module:
    """Build this rank's stages of ``module`` and the schedule, keeping them on ``strategy``
    (``stage_modules``, ``pipeline_stages``, ``schedule``, ...); returns the first local stage."""
    from torch.distributed.pipelining import PipelineStage, schedules

    s = strategy
    layers = module.pipeline_layers() if hasattr(module, "pipeline_layers") else None
    warn_unused_steps(module)
    if not layers:
        raise ValueError(f"strategy=pipeline needs {type(module).__name__}.pipeline_layers() to return the model's "
                         f"layers in order (it returned {layers!r}); see TrainModule.pipeline_layers")
    s._batch_size = batch_size = s.batch.batch_size  # (the run's resolved micro-batch: Strategy.use_batch)
    if batch_size % s.microbatches:
        raise ValueError(f"strategy.microbatches={s.microbatches} does not divide data.batch_size={batch_size}; "
                         f"choose a divisor of {batch_size}")
    parts = s.pp_size * s.virtual_stages
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    bounds = partition_layers(sizes, parts, s.partition)
    if distributed.rank() == 0:
        log.info("pipeline partition (%s) over %d stages, %d per rank, schedule %s, %d microbatches, dp %d, tp %d:",
                 s.partition, parts, s.virtual_stages, s.schedule_name, s.microbatches, s.data_parallel_size(), s.tp)
        for i in range(parts):
            log.info("  stage %d (pp rank %d): layers %d-%d, %d parameters", i, i % s.pp_size,
                     bounds[i], bounds[i + 1] - 1, sum(sizes[bounds[i]:bounds[i + 1]]))
    s.stage_ids = [s.pp_rank + k * s.pp_size for k in range(s.virtual_stages)]
    check_layers_cover_parameters(module, layers, bounds)
    my_layers = [layer for i in s.stage_ids for layer in layers[bounds[i]:bounds[i + 1]]]
    module_names = {id(m): n for n, m in module.named_modules()}
    # The build's units (tensor parallel, then FSDP): each pipeline layer (a wrapper the module
    # does not register: its children).
    units = [u for layer in my_layers
             for u in ([layer] if id(layer) in module_names else layer.children())] \
        if s.shards_stages or s.tp > 1 else []
    plans = stage_plans(module, s.tp, layers, my_layers, units) if s.tp > 1 else {}

    def shard(unit: nn.Module) -> None:  # tensor parallel, then FSDP over the replicas
        if s.tp > 1:
            parallelize_unit(unit, plans[id(unit)], s.tp_mesh)
        if s.shards_stages:
            s._shard_unit(unit)
    if has_meta_tensors(module):  # built under init_context(): materialise this rank's stages only
        kept = {module_names[id(m)] for layer in my_layers for m in layer.modules() if id(m) in module_names}
        (init or WeightInit(module, module.trainer.seed)).materialize(s.device, units, shard, keep=kept.__contains__)
    else:
        for unit in units:
            shard(unit.to(s.device))
    s.stage_modules = [Stage(layers[bounds[i]:bounds[i + 1]]).to(s.device) for i in s.stage_ids]
    for stage in s.stage_modules if s.shards_stages else []:
        s._shard_unit(stage)
    names = {id(p): n for n, p in module.named_parameters()}  # materialising / sharding swapped tensors
    names.update({id(b): n for n, b in module.named_buffers()})
    mine = {id(t) for m in s.stage_modules for t in [*m.parameters(), *m.buffers()]}
    s._full_order = list(names.values())
    # Drop the other stages' tensors from the module, so that its parameters (the optimizer's),
    # state dict and checkpoints hold only this rank's stages.
    for owner in module.modules():
        for registry in (owner._parameters, owner._buffers):
            for key in [k for k, t in registry.items() if t is not None and id(t) not in mine]:
                del registry[key]
    # Full names of this rank's tensors, for full_state_dict.
    s.local_names = {names[id(t)]: t for m in s.stage_modules for t in [*m.parameters(), *m.buffers()]}
    s.stage_parameters = [p for m in s.stage_modules for p in m.parameters()]
    s._module = module
    #: this rank's ``PipelineStage`` objects (bench/pipeline_bubble.py times their chunks)
    s.pipeline_stages = stages = [PipelineStage(m, i, parts, s.device, group=s.pp_group)
                                  for m, i in zip(s.stage_modules, s.stage_ids)]
    cls_name, multi = SCHEDULES[s.schedule_name]
    cls = getattr(schedules, cls_name)
    # scale_grads=False: the strategy's loss function scales each microbatch to its global share.
    s.schedule = cls(stages if multi else stages[0], s.microbatches, loss_fn=s._loss_fn, scale_grads=False)
    s.is_last = (parts - 1) in s.stage_ids
    s.is_first = 0 in s.stage_ids
    return s.stage_modules[0]


def warn_unused_steps(module: nn.Module) -> None:
    """Under the pipeline ``pipeline_loss`` replaces ``training_step`` / ``validation_step``: a module
    that overrides them is told once that they do not run (they are not silently skipped)."""
    from trainer.api.module import TrainModule
    from trainer.runtime.rank_logging import rank_zero_warn

    unused = [name for name in ("training_step", "validation_step")
              if getattr(type(module), name, None) is not getattr(TrainModule, name)]
    if unused:
        rank_zero_warn(log, "strategy=pipeline runs %s.pipeline_loss() on the last stage instead of %s; what those "
                       "compute beyond the loss must be returned by pipeline_loss to be logged",
                       type(module).__name__, " / ".join(f"{name}()" for name in unused))
