"""One rank of an N-D layout, laid out in this process on torch's fake process group: no weights, no peers.

``rank_layout`` does for one rank of a world of any size what ``strategy=nd`` does on a real one,
with the same torch calls: ``init_process_group("fake", store=FakeStore(), rank=r, world_size=N)``
(torch's fake backend: collectives return at once and move nothing; torchtitan's
``comm.mode=fake_backend``), ``ParallelDims.build_mesh``, the module built on the meta device
(``__init__`` and ``configure_model``: every tensor has a shape and no storage), this rank's
pipeline stage kept (``pipeline_partition.partition_layers``, as the pipeline cuts the layers), the
module's tensor-parallel plan applied over ``mesh["tp"]`` (``tensor_parallel.apply_plan``) and
``fully_shard`` per unit, then the root, over the data-parallel dimensions. Then every parameter of
this rank is read back: its global shape, its local shape and its local storage (FSDP's padded
shard), which is what the rank allocates when the run is real.

The process must hold no process group of its own (one fake group per rank, made and destroyed here).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from trainer.strategies.parallel_dims import ParallelDims
from trainer.strategies.pipeline_partition import Stage, check_layers_cover_parameters, partition_layers
from trainer.strategies.pipeline_tp import parallelize_unit, stage_plans
from trainer.strategies.tensor_parallel import apply_plan, expand_plan, module_plan
from trainer.strategies.wrap_policy import select_units


@dataclass(frozen=True)
class Shard:
    """One parameter as one rank holds it."""

    name: str
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]  # this rank's own elements (FSDP: without the padding)
    storage_numel: int  # elements of the local storage (FSDP: the padded shard; what is allocated)
    element_size: int  # bytes per element as built (the module's dtype)
    trainable: bool
    unit: int  # index of the FSDP unit holding it (the root's last); 0 without FSDP
    placements: str  # the DTensor placements over the mesh dims, "" for a plain tensor
    grad_numel: int = -1  # elements of its gradient's local storage; -1: as ``storage_numel``

    @property
    def gradient_numel(self) -> int:
        return self.storage_numel if self.grad_numel < 0 else self.grad_numel

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def global_numel(self) -> int:
        return math.prod(self.global_shape)

    @property
    def bytes(self) -> int:
        """Bytes this rank allocates for the parameter (padded storage)."""
        return self.storage_numel * self.element_size


@dataclass
class RankLayout:
    """What one rank of the layout holds."""

    rank: int
    dims: ParallelDims
    coordinates: dict[str, int]
    module_name: str
    shards: list[Shard]
    stages: list[int] = field(default_factory=list)  # pipeline stages of this rank (pp > 1)
    stage_layers: list[tuple[int, int]] = field(default_factory=list)  # (first, last) layer of each
    layer_count: int = 0  # pipeline layers of the whole model (pp > 1)
    units: int = 1  # FSDP units (the root included); 1 without FSDP
    fsdp_group: int = 1  # ranks one parameter is sharded over (dp_shard; 1: not sharded)

    @property
    def parameter_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


@contextmanager
def fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """This process as ``rank`` of ``world_size`` on torch's fake backend, for the block's duration."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a dry run makes its own (fake) process group; run it in a process without one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def build_on_meta(make_module: Callable[[], nn.Module], mesh: Any = None) -> nn.Module:
    """``make_module()`` and its ``configure_model()`` on the meta device: shapes, no storage. The
    module's ``device_mesh`` is ``mesh`` in ``configure_model``, as strategy=nd sets it."""
    with torch.device("meta"):
        module = make_module()
        if mesh is not None:
            module.__dict__["_device_mesh"] = mesh
        if hasattr(module, "configure_model"):
            module.configure_model()
    return module


def check_plan(module: nn.Module, tp: int) -> dict[str, Any]:
    """The module's expanded plan, checked for ``tp`` ranks (one-line ValueErrors); {} when tp is 1 or
    when ``configure_model`` made DTensor parameters itself (Lightning's way: used as they are)."""
    if tp == 1 or any(hasattr(p, "placements") for p in module.parameters()):
        return {}
    plan = module_plan(module)
    if plan is None:
        raise ValueError(f"strategy.tp={tp}: {type(module).__name__} declares no tensor_parallel_plan(); declare one "
                         "(TrainModule.tensor_parallel_plan) or set strategy.tp=1")
    if hasattr(module, "check_tensor_parallel"):
        module.check_tensor_parallel(tp)
    return expand_plan(module, plan)


def _placements(tensor: torch.Tensor) -> str:
    """``dp_shard: _S(0, 4), tp: S(0)``: each mesh dimension the DTensor lies on and its placement."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return ""
    names = tensor.device_mesh.mesh_dim_names or [str(i) for i in range(len(placements))]
    return ", ".join(f"{n}: {p}" for n, p in zip(names, placements))


def _tp_placement(tensor: torch.Tensor) -> str | None:
    """The DTensor's placement on the mesh's ``tp`` dimension (``S(0)``, ``R``), None if it has none."""
    placements = getattr(tensor, "placements", None)
    names = tensor.device_mesh.mesh_dim_names if placements is not None else None
    return str(placements[names.index("tp")]) if names and "tp" in names else None


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _this_stage(module: nn.Module, dims: ParallelDims, layout: RankLayout, partition: Any,
                virtual_stages: int, tp_mesh: Any) -> tuple[list[nn.Module], list[nn.Module]]:
    """This rank's pipeline stages, cut and split as the pipeline does it (``partition_layers``, then
    pipeline_tp.py's plan per unit): the units (each layer; a wrapper the module does not register:
    its children), split over ``tp_mesh``, and the stage roots. Records the stages on ``layout``."""
    layers = module.pipeline_layers() if hasattr(module, "pipeline_layers") else None
    if not layers:
        raise ValueError(f"strategy.pp={dims.pp}: {type(module).__name__}.pipeline_layers() returns no layers; "
                         "a pipeline needs the model's layers in order (TrainModule.pipeline_layers)")
    parts = dims.pp * virtual_stages
    bounds = partition_layers([sum(p.numel() for p in layer.parameters()) for layer in layers], parts, partition)
    check_layers_cover_parameters(module, layers, bounds)
    layout.stages = [layout.coordinates["pp"] + k * dims.pp for k in range(virtual_stages)]
    layout.stage_layers = [(bounds[s], bounds[s + 1] - 1) for s in layout.stages]
    layout.layer_count = len(layers)
    mine = [layer for s in layout.stages for layer in layers[bounds[s]:bounds[s + 1]]]
    registered = {id(m) for m in module.modules()}
    units = [u for layer in mine for u in ([layer] if id(layer) in registered else layer.children())]
    if dims.tp > 1 and not any(hasattr(p, "placements") for p in module.parameters()):
        plans = stage_plans(module, dims.tp, layers, mine, units)
        for unit in units:
            parallelize_unit(unit, plans[id(unit)], tp_mesh)
    return units, [Stage(layers[bounds[s]:bounds[s + 1]]) for s in layout.stages]


def rank_layout(make_module: Callable[[], nn.Module], dims: ParallelDims, rank: int, *, wrap: Any = "auto",
                min_num_params: int | None = None, partition: Any = "parameters", virtual_stages: int = 1,
                data_parallel: str = "fsdp") -> RankLayout:
    """Rank ``rank`` of the ``dims`` layout of the module ``make_module()`` builds (see the module docstring).

    ``wrap`` / ``min_num_params``: FSDP's units (``strategy.wrap``), as the strategy selects them
    (pp = 1); with pp > 1 each pipeline layer is a unit, as the pipeline shards its stages.
    ``partition`` / ``virtual_stages``: the pipeline's cut (``strategy.partition``) and stages per rank.
    ``data_parallel``: fsdp (``fully_shard`` over the data-parallel dims, strategy=nd's way, and the
    pipeline's ``data_parallel=fsdp``) or ddp (replicas hold whole copies: the pipeline's default)."""
    if not 0 <= rank < dims.world_size:
        raise ValueError(f"dry_run.rank={rank} is not a rank of the {dims.world_size}-rank layout ({dims.describe()}); "
                         f"choose 0..{dims.world_size - 1}")
    if dims.cp > 1:
        raise ValueError(f"strategy.cp={dims.cp}: context parallel needs CUDA ring attention and is refused here; "
                         "set strategy.cp=1")
    from torch.distributed.fsdp import FSDPModule, fully_shard

    with fake_process_group(rank, dims.world_size):
        mesh, _ = dims.build_mesh("cpu")
        module = build_on_meta(make_module, mesh)
        plan = check_plan(module, dims.tp)
        coordinates = dims.coordinates(rank)
        layout = RankLayout(rank, dims, coordinates, type(module).__name__, [])
        if dims.pp > 1:  # the plan applied per unit of this rank's stages
            units, roots = _this_stage(module, dims, layout, partition, virtual_stages, mesh["tp"])
        else:
            declared = module.block_classes() if hasattr(module, "block_classes") else ()
            units = select_units(module, wrap, declared, min_num_params)
            roots = [module]
        # The parameters are read back by name: tensor parallel and FSDP swap the parameter objects.
        names = {id(p): n for n, p in module.named_parameters()}
        held = [names[id(p)] for root in roots for p in root.parameters()]
        unit_of: dict[str, int] = {}
        for index, unit in enumerate([*units, *roots]):  # children first: a parameter's unit is its innermost one
            for p in unit.parameters():
                unit_of.setdefault(names[id(p)], index)
        if dims.pp == 1:  # (with pp > 1 the plan was applied per unit of this rank's stages)
            apply_plan(module, plan, mesh["tp"])
        fsdp = dims.dp > 1 and data_parallel == "fsdp"
        if fsdp and not any(isinstance(m, FSDPModule) for m in module.modules()):  # (else: configure_model did)
            dp_mesh = mesh["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else mesh["dp_shard"]
            for unit in [*units, *roots]:
                fully_shard(unit, mesh=dp_mesh)
        if fsdp:
            layout.units, layout.fsdp_group = len(units) + len(roots), dims.dp_shard
        for name in held:
            p = module.get_parameter(name)
            local = _local(p)
            # FSDP's local shard is a view of its own padded storage; a plain or TP-only tensor is its storage.
            storage = local.untyped_storage().nbytes() // local.element_size() if fsdp else local.numel()
            owner = module.get_submodule(name.rpartition(".")[0])
            # Measured (torch 2.13): the backward of an embedding split by rows over tp gives a Replicate
            # gradient, the whole table on every tp rank. Under FSDP the reduce-scatter output holds it.
            whole_grad = not fsdp and isinstance(owner, nn.Embedding) and _tp_placement(p) == "S(0)"
            layout.shards.append(Shard(name, tuple(p.shape), tuple(local.shape), storage, local.element_size(),
                                       p.requires_grad, unit_of[name] if fsdp else 0, _placements(p),
                                       p.numel() if whole_grad else -1))
    return layout


def representative_ranks(dims: ParallelDims) -> dict[int, int]:
    """Every rank -> the rank holding the same shards with dp_replicate (and cp) coordinate 0: the
    replicas of a layout hold the same, so only ``pp x dp_shard x tp`` layouts need building."""
    stride = {}
    size = 1
    for name, degree in reversed(list(zip(("pp", "dp_replicate", "dp_shard", "cp", "tp"), dims.sizes()))):
        stride[name] = size
        size *= degree
    out = {}
    for rank in range(dims.world_size):
        c = dims.coordinates(rank)
        out[rank] = rank - c["dp_replicate"] * stride["dp_replicate"] - c["cp"] * stride["cp"]
    return out


def all_layouts(make_module: Callable[[], nn.Module], dims: ParallelDims, **options: Any) -> list[RankLayout]:
    """Every rank's layout (one built per distinct ``pp x dp_shard x tp`` coordinate, shared by its
    replicas: a replica's entry is the same object, its ``rank`` the built one's)."""
    rep = representative_ranks(dims)
    built = {r: rank_layout(make_module, dims, r, **options) for r in sorted(set(rep.values()))}
    return [built[rep[rank]] for rank in range(dims.world_size)]
