"""N-D parallelism on one device mesh: tensor parallel x FSDP / HSDP (``strategy=nd``).

The degrees ``pp x dp_replicate x dp_shard x cp x tp`` multiply to the world size (one of them may
be ``-1``: the rest), checked in one place (trainer/strategies/parallel_dims.py) before any worker
starts; every rank then builds one DeviceMesh with those named dimensions. What runs on it, in
torchtitan's order:

1. the module gets the mesh (``self.device_mesh``) before ``configure_model``;
2. tensor parallel (``tp > 1``) over ``mesh["tp"]``: the module's ``tensor_parallel_plan()`` applied
   to the built model (a meta-device build: each FSDP unit's part as it is materialised, the rest at
   the root), or the DTensors a ``configure_model`` made itself with ``self.device_mesh["tp"]``
   (Lightning's way) kept as they are;
3. activation checkpointing and compile (the Trainer's options), per block;
4. FSDP2 (``fully_shard``) per unit then the root over the data-parallel dimensions (``dp_shard > 1``
   or ``dp_replicate > 1``): ``mesh["dp_shard"]``, or HSDP over ``mesh["dp_replicate", "dp_shard"]``
   (``dp_shard`` 1 there: replicas only); the tensor-parallel DTensors compose with it (FSDP2's 2-D).
   With ``dp_replicate x dp_shard = 1`` there is no FSDP: the tensor-parallel ranks hold their
   DTensor gradients, no data-parallel sync.

The ranks of one tensor-parallel group load the same samples (``data_parallel_rank``); the metric
sums count each data-parallel rank once (`NDStrategy.all_reduce_sum`); the gradient norm is
taken over every mesh dimension. ``loss_parallel``: each micro-batch's forward and backward (and
the evaluation forwards) run inside torch's ``loss_parallel()``, so a cross-entropy over logits left
sharded on the vocabulary (``ColwiseParallel(use_local_output=False)`` on the output projection)
never gathers them. Losses and metrics reach the loop as plain tensors.

The other strategies stay as they are, not special cases of this one: DDP buckets and overlaps its
all-reduce with the backward and has ZeRO-1, which FSDP2 over a replicate-only mesh does not; FSDP's
sharding modes (grad_op, no_shard, hybrid by shard size), CPU offload and manual-optimization units,
and the pipeline's schedules, are tested as they are. ``strategy=nd`` covers the compositions; with
``tp = 1`` it builds the same FSDP2 as ``strategy=fsdp`` (it shares FSDPStrategy's code). With pipeline
stages (``pp > 1``) ``NDStrategy(...)`` builds `NDPipelineStrategy`: the pipeline strategy on the
same mesh (its stages x replicas x tp, rank for rank). Context parallel (``cp > 1``, CUDA ring
attention) is refused.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any, ContextManager, Sequence

import torch
from torch import nn

from trainer.runtime import distributed
from trainer.runtime.launch import ClusterEnvironment
from trainer.strategies.base import Strategy
from trainer.strategies.fsdp import FSDPStrategy, _sharded_root, remember_root
from trainer.strategies.nd_probe import check_plan_before_launch
from trainer.strategies.nd_step import NDStepForward, grad_norm_over_meshes, loss_parallel_once, scale_gradients
from trainer.strategies.parallel_dims import ParallelDims, check_degrees
from trainer.strategies.pipeline import PipelineStrategy
from trainer.strategies.tensor_parallel import apply_plan, expand_plan, module_plan, plan_under
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import select_units

log = logging.getLogger(__name__)


def _has_dtensors(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _builds_in_configure_model(module: nn.Module) -> bool:
    """Whether ``module`` has a ``configure_model`` of its own (where it may split itself, Lightning's way)."""
    from trainer.api.module import TrainModule

    own = getattr(type(module), "configure_model", None)
    return own is not None and own is not getattr(TrainModule, "configure_model", None)


def _no_plan(module: nn.Module, tp: int) -> ValueError:
    return ValueError(f"strategy.tp={tp} but {type(module).__name__} declares no tensor_parallel_plan() and its "
                      "configure_model made no DTensor parameters; declare a plan (TrainModule.tensor_parallel_plan), "
                      "or set strategy.tp=1")


class NDStrategy(FSDPStrategy):
    """Tensor parallel x FSDP / HSDP on one device mesh (see the module docstring).

    Args:
        pp: pipeline stages; > 1 builds an `NDPipelineStrategy` instead (the pipeline's settings
            ``schedule``, ``microbatches``, ``partition``, ``virtual_stages`` apply then, and only then).
        dp_replicate: data-parallel replicas (HSDP's outer dimension; DDP-like when alone).
        dp_shard: data-parallel ranks sharding parameters, gradients and optimizer state (FSDP); -1: the rest.
        cp: context parallel; only 1 (it needs CUDA ring attention).
        tp: tensor-parallel ranks (the module's ``tensor_parallel_plan()`` applied over them).
        loss_parallel: with ``tp > 1``, run forward and backward inside ``loss_parallel()``.
        wrap: as strategy=fsdp's.
        min_num_params: as strategy=fsdp's.
        param_dtype: as strategy=fsdp's (the dtypes are FSDP's mixed-precision policy, so they need a
            data-parallel dimension: ``dp_replicate x dp_shard > 1``).
        reduce_dtype: as strategy=fsdp's (needs ``dp_replicate x dp_shard > 1``, as ``param_dtype``).
        output_dtype: as strategy=fsdp's (needs ``dp_replicate x dp_shard > 1``, as ``param_dtype``).
        meta_init: as strategy=fsdp's.
        sync_every_microbatch: as strategy=fsdp's.
    """

    name = "nd"
    sync_batchnorm_refusal = ("the nd strategy does not synchronise batch norm statistics over its "
                              "data-parallel ranks; use a LayerNorm / RMSNorm, or strategy=ddp / fsdp")
    group_holders = ("mesh", "world_mesh", "dp_mesh", "_tp_mesh", "_meshed_module")

    def __new__(cls, accelerator: str = "auto", pp: int = 1, **options: Any) -> Any:
        # pp > 1: the pipeline strategy on the same mesh (stages x replicas x tp), named nd.
        if cls is NDStrategy and pp != 1:
            return NDPipelineStrategy.of_nd(accelerator, pp, **options)
        return super().__new__(cls)

    def __init__(
        self,
        accelerator: str = "auto",
        pp: int = 1,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        loss_parallel: bool = True,
        wrap: str | Sequence[str] = "auto",
        min_num_params: int | None = None,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        output_dtype: str | None = None,
        meta_init: bool = False,
        sync_every_microbatch: bool = False,
        schedule: str = "1f1b",
        microbatches: int | None = None,
        partition: str | Sequence[int] = "parameters",
        virtual_stages: int | None = None,
    ):
        pipeline_settings = {"schedule": (schedule, "1f1b"), "microbatches": (microbatches, None),
                             "partition": (partition, "parameters"), "virtual_stages": (virtual_stages, None)}
        for name, (value, default) in pipeline_settings.items():
            if value != default:
                raise ValueError(f"strategy.{name}={value!r} is a pipeline setting: it applies with strategy.pp > 1, "
                                 f"and this run has strategy.pp={pp}; leave it out or set strategy.pp")
        super().__init__(accelerator, sharding="full", wrap=wrap, min_num_params=min_num_params,
                         param_dtype=param_dtype, reduce_dtype=reduce_dtype, output_dtype=output_dtype,
                         meta_init=meta_init, sync_every_microbatch=sync_every_microbatch)
        self.degrees = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
        check_degrees(self.degrees)
        if cp != 1:
            raise ValueError(f"strategy.cp={cp}: context parallel needs CUDA ring attention (torch's "
                             "context_parallel over SDPA), which this trainer does not run; set strategy.cp=1")
        if not isinstance(loss_parallel, bool):
            raise ValueError(f"strategy.loss_parallel={loss_parallel!r} must be true or false")
        self.loss_parallel = loss_parallel
        #: the dtypes given explicitly (FSDP's policy: refused where there is no FSDP)
        self._explicit_dtypes = {name: value for name, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype),
                                                                 ("output_dtype", output_dtype)) if value is not None}
        self.dims: ParallelDims | None = None
        self.world_mesh: Any = None  # every dimension, named (ParallelDims.build_mesh)
        self.dp_mesh: Any = None  # the flattened data-parallel ranks
        self._pending: dict[str, Any] = {}  # the expanded plan not applied yet (meta-device builds)
        self._names: dict[int, str] = {}  # id(submodule) -> its name (meta-device builds)
        self._tp_mesh: Any = None
        self._meshed_module: nn.Module | None = None  # the module given the mesh (taken back at teardown)

    # ----- processes and devices ------------------------------------------------------------------------
    def resolve(self, world_size: int) -> ParallelDims:
        """The degrees for ``world_size`` processes (ValueError, one line, when they do not fit)."""
        return ParallelDims.resolve(world_size, **self.degrees)

    def check_world_size(self, world_size: int, devices_per_node: int) -> None:
        dims = self.resolve(world_size)
        if dims.dp == 1 and self._explicit_dtypes:
            name, value = next(iter(self._explicit_dtypes.items()))
            raise ValueError(f"strategy.{name}={value!r} sets FSDP's mixed-precision policy, and this layout "
                             f"({dims.describe()}) has no data-parallel sharding (dp_replicate x dp_shard = 1); "
                             "use trainer.precision=bf16-mixed, or set the dtypes to null")
        self.dims = dims

    def data_parallel_size(self, world_size: int | None = None) -> int:
        if world_size is None:
            return self.dims.dp if self.dims is not None else distributed.world_size()
        return self.resolve(world_size).dp

    @property
    def data_parallel_rank(self) -> int:
        return self.dims.data_parallel_rank(distributed.rank()) if self.dims is not None else distributed.rank()

    @property
    def random_stream_rank(self) -> int:
        """The first rank of this rank's tensor-parallel group: its ranks draw the same dropout masks
        on the activations they hold replicated."""
        rank = distributed.rank()
        return self.dims.tp_group_first_rank(rank) if self.dims is not None else rank

    def setup_environment(self, env: ClusterEnvironment, timeout: timedelta) -> None:
        Strategy.setup_environment(self, env, timeout)  # alone: a group of one (needs_process_group)
        self.dims = self.resolve(distributed.world_size())
        self.world_mesh, self.dp_mesh = self.dims.build_mesh(self.device.type)
        # FSDP's mesh: HSDP (replicate, shard) when there are replicas, else the shard dimension alone.
        self.mesh = self.world_mesh["dp_replicate", "dp_shard"] if self.dims.dp_replicate > 1 else self.world_mesh["dp_shard"]
        self._tp_mesh = self.world_mesh["tp"]
        log.info("strategy nd: %s", self.dims.describe())

    # ----- before any worker starts -----------------------------------------------------------------------
    def check_module(self, module: nn.Module) -> None:
        if (self.dims.dp_shard if self.dims is not None else self.degrees["dp_shard"]) != 1:
            super().check_module(module)  # FSDP's units (dp_shard=-1 before the world size is known: may shard)
        tp = self.dims.tp if self.dims is not None else self.degrees["tp"]
        if tp == -1 or tp == 1:
            return
        check = getattr(module, "check_tensor_parallel", None)
        if callable(check):
            check(tp)
        if module_plan(module) is None and not _builds_in_configure_model(module):
            # Nothing could split it: no plan, and no configure_model of its own to apply one.
            raise _no_plan(module, tp)
        check_plan_before_launch(module)

    # ----- building ------------------------------------------------------------------------------------
    def before_configure_model(self, module: nn.Module) -> None:
        module.__dict__["_device_mesh"] = self.world_mesh
        self._meshed_module = module  # its mesh is taken back at teardown

    def teardown(self, clean: bool = True) -> None:
        # The module the caller keeps must not hold the mesh, hence its groups, past the run (a later
        # run gives it the mesh of that run).
        module = getattr(self, "_meshed_module", None)
        if module is not None:
            module.__dict__.pop("_device_mesh", None)
        super().teardown(clean)

    def parallelize(self, module: nn.Module) -> None:
        """Tensor parallel: the whole plan on an eager build; a meta-device build keeps it for ``wrap``."""
        self._pending, self._names = {}, {}
        if self.dims.tp == 1 or _sharded_root(module) is not None:
            return
        if _has_dtensors(module):  # configure_model applied its own plan (Lightning's way): used as it is
            log.info("tensor parallel: %s's configure_model made DTensor parameters itself; no plan applied",
                     type(module).__name__)
            return
        plan = module_plan(module)
        if plan is None:
            raise _no_plan(module, self.dims.tp)
        expanded = expand_plan(module, plan)
        if has_meta_tensors(module):
            self._pending = expanded
            self._names = {id(m): name for name, m in module.named_modules()}
        else:
            apply_plan(module, expanded, self._tp_mesh)
        log.info("tensor parallel over %d ranks: %d submodules split", self.dims.tp, len(expanded))

    def _apply_pending(self, unit: nn.Module, prefix: str) -> None:
        """Apply the entries of the pending plan inside ``unit`` (named ``prefix``)."""
        if not self._pending:
            return
        apply_plan(unit, plan_under(self._pending, prefix), self._tp_mesh)
        self._pending = {name: style for name, style in self._pending.items()
                         if prefix and name != prefix and not name.startswith(prefix + ".")}

    def _shard_unit(self, unit: nn.Module, options: dict) -> None:
        self._apply_pending(unit, self._names.get(id(unit), ""))
        super()._shard_unit(unit, options)

    def _root_forward(self, module: nn.Module) -> nn.Module:
        self._apply_pending(module, "")  # what no unit holds, now the units are done
        return NDStepForward(module, self.loss_parallel and self.dims.tp > 1)

    def _make_ranks_equal(self, module: nn.Module) -> None:
        """Every rank starts from rank 0's weights: plain tensors from global rank 0, tensor-parallel
        shards (already scattered from the tp group's first rank) from the first data-parallel rank."""
        from torch.distributed.tensor import DTensor

        dp_group = self.dp_mesh.get_group() if self.dims.dp > 1 else None
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                if isinstance(tensor, DTensor):
                    if dp_group is not None:
                        torch.distributed.broadcast(tensor.to_local(), group=dp_group, group_src=0)
                elif distributed.is_distributed():
                    torch.distributed.broadcast(tensor.data, src=0)

    def wrap(self, module: nn.Module, init: WeightInit | None = None) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        sharded = _sharded_root(module)
        if sharded is not None:  # fitted earlier in this process: validate / test / predict it as it is
            return sharded
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            # configure_model called fully_shard itself (Lightning's way): not sharded again.
            if has_meta_tensors(module):
                raise ValueError(f"{type(module).__name__}'s configure_model sharded the model with fully_shard but "
                                 "left meta-device tensors; materialise them there, or let strategy=nd shard it")
            root = self._root_forward(module)
        elif self.dims.dp > 1:
            return super().wrap(module, init)  # FSDP2 over the data-parallel mesh (_shard_unit: TP first)
        else:
            if has_meta_tensors(module):
                if init is None:
                    raise ValueError("a meta-device model needs a WeightInit to materialise it")
                declared = module.block_classes() if hasattr(module, "block_classes") else ()
                units = select_units(module, self.wrap_classes, declared, self.min_num_params)
                init.materialize(self.device, units, lambda unit: self._apply_pending(unit, self._names.get(id(unit), "")))
            else:
                self._make_ranks_equal(module)
            root = self._root_forward(module)
        remember_root(module, root)
        return root

    # ----- the step -------------------------------------------------------------------------------------
    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        from torch.distributed.fsdp import FSDPModule

        if not self.sync_every_microbatch:
            if isinstance(wrapped, FSDPModule):
                wrapped.set_requires_gradient_sync(sync)
            else:  # sharded by the user's configure_model: each of its units
                for unit in self._user_units(wrapped):
                    unit.set_requires_gradient_sync(sync, recurse=False)
        if self.loss_parallel and self.dims.tp > 1:
            return loss_parallel_once()
        return contextlib.nullcontext()

    def _user_units(self, wrapped: nn.Module) -> list[nn.Module]:
        units = wrapped.__dict__.get("_nd_user_units")
        if units is None:
            from torch.distributed.fsdp import FSDPModule

            units = wrapped.__dict__["_nd_user_units"] = [m for m in wrapped.modules() if isinstance(m, FSDPModule)]
        return units

    def grad_norm(self, module: nn.Module) -> torch.Tensor:
        return grad_norm_over_meshes(module)

    def clip_grad_norm(self, module: nn.Module, max_norm: float) -> torch.Tensor:
        total = self.grad_norm(module)
        scale_gradients(module, max_norm, total)
        return total

    # ----- collectives ---------------------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the world, each data-parallel rank counted once: the ranks of one tensor-parallel
        group hold the same value (the same samples, a replicated loss), so all but its first add zero."""
        if distributed.is_distributed():
            if self.dims is not None and self.dims.tp > 1 and self.dims.coordinates(distributed.rank())["tp"] != 0:
                tensor.zero_()
            torch.distributed.all_reduce(tensor)
        return tensor


#: settings of strategy=nd that only its FSDP path (pp = 1) reads, with their defaults
_FSDP_ONLY = {"wrap": "auto", "min_num_params": None, "param_dtype": None, "reduce_dtype": None,
              "output_dtype": None, "sync_every_microbatch": False}


class NDPipelineStrategy(PipelineStrategy):
    """strategy=nd with ``pp > 1``: the pipeline strategy (trainer/strategies/pipeline.py) on the nd
    mesh, rank for rank: ``pp`` stages, the replicas from ``dp_replicate`` / ``dp_shard`` (ddp, fsdp or
    hsdp over them), the module's tensor-parallel plan over ``tp`` inside each stage. The pipeline's
    settings (``schedule``, ``microbatches``, ``partition``, ``virtual_stages``) apply; FSDP's own
    (``wrap``, the dtypes, ``sync_every_microbatch``) do not, and are refused when given."""

    name = "nd"

    @classmethod
    def of_nd(cls, accelerator: str, pp: int, **options: Any) -> NDPipelineStrategy:
        degrees = {name: options.pop(name) for name in ("dp_replicate", "dp_shard", "cp", "tp") if name in options}
        for name, default in _FSDP_ONLY.items():
            value = options.pop(name, default)
            if value != default:
                raise ValueError(f"strategy.{name}={value!r} applies to strategy=nd without pipeline stages (pp = 1); "
                                 f"with strategy.pp={pp} the stages are sharded by the pipeline: leave it out")
        degrees.setdefault("dp_shard", -1)  # nd's default: the rest of the world shards
        return cls.from_degrees(pp=pp, **degrees, accelerator=accelerator, **options)
