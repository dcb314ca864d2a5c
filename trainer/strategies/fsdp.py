"""Fully sharded data parallel on PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Sharding modes, and what they are called elsewhere:

==========  ==============================  ========================  =====================================
sharding    what is sharded                 DeepSpeed                 FSDP1 ``ShardingStrategy``
==========  ==============================  ========================  =====================================
full        params, grads, optimizer state  ZeRO stage 3              FULL_SHARD
grad_op     params*, grads, optimizer state ZeRO stage 2 (+ params)   SHARD_GRAD_OP
no_shard    nothing (replicated, like DDP)  stage 0                   NO_SHARD
hybrid      all three, within groups of     ZeRO++ hpZ-like /         HYBRID_SHARD
            ``shard_size`` ranks; replicas  MiCS
            across groups
==========  ==============================  ========================  =====================================

``*`` grad_op keeps each unit's gathered parameters from forward until its backward
(``reshard_after_forward=False``): no second all-gather, more memory; with gradient accumulation
they stay gathered through the whole window (one all-gather per unit per optimizer step). ZeRO stage 1 (optimizer state
only) is ``strategy=ddp strategy.zero1=true``.

FSDP2 mapping: full/grad_op use a 1-D mesh over all ranks; hybrid a 2-D (replicate, shard) mesh;
no_shard the same 2-D mesh with shard size 1. Gradients are averaged over all ranks in every mode.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from datetime import timedelta
from typing import Any, ContextManager, Sequence

import torch
from torch import nn

from trainer.runtime import distributed
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.strategies.base import Strategy, TrainingStepForward
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import describe_units, leftover_units, own_parameters, select_units

log = logging.getLogger(__name__)

SHARDING_MODES = ("full", "grad_op", "no_shard", "hybrid")
DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def parse_dtype(value: str | torch.dtype | None, option: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f"{option}={value!r} is not a dtype; choose one of {sorted(DTYPES)} or null")
    return DTYPES[value]


class FSDPStrategy(Strategy):
    """Shard parameters, gradients and optimizer state over the ranks (FSDP2).

    Args:
        sharding: "full" | "grad_op" | "no_shard" | "hybrid" (see the table above).
        shard_size: hybrid only: ranks per sharding group (default: the processes of one node);
            must divide the world size.
        wrap: which submodules become their own unit: "auto" (the module's ``block_classes()``,
            else the children of its ModuleLists), "none", or a list of class names. Under manual
            optimization the parameters left outside these get units of their own (the topmost
            modules holding them), so each ``manual_backward`` reduces them; parameters of the
            module itself are refused there.
        min_num_params: also make a unit of every module holding at least this many parameters
            not already in a unit (size-based policy); None = off.
        param_dtype: the mixed-precision policy's compute dtype ("bf16", "fp16", "fp32" or None =
            keep fp32). The sharded master weights stay fp32.
        reduce_dtype: the dtype gradients are reduced in ("bf16", "fp16", "fp32" or None = keep fp32).
        output_dtype: the dtype the forward's outputs are cast to ("bf16", "fp16", "fp32" or None =
            as computed).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory (needs CUDA).
        meta_init: build the model on the meta device and materialise it unit by unit, so no rank
            ever holds the full model (see ``trainer/strategies/weight_init.py``).
        sync_every_microbatch: with gradient accumulation, reduce-scatter after every micro-batch
            (keeps only sharded gradients: less memory, more communication). Default: sync on the
            last micro-batch only, accumulating unsharded gradients in between.
    """

    name = "fsdp"
    supports_multiple_devices = True
    lockstep_forward = True
    #: one process still gets FSDP's semantics (mixed-precision policy, offload, units)
    needs_process_group = True
    group_holders = ("mesh",)

    def __init__(
        self,
        accelerator: str = "auto",
        sharding: str = "full",
        shard_size: int | None = None,
        wrap: str | Sequence[str] = "auto",
        min_num_params: int | None = None,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        output_dtype: str | None = None,
        cpu_offload: bool = False,
        meta_init: bool = False,
        sync_every_microbatch: bool = False,
    ):
        super().__init__(accelerator)
        if sharding not in SHARDING_MODES:
            raise ValueError(f"strategy.sharding={sharding!r} is not one of {', '.join(SHARDING_MODES)}")
        if shard_size is not None and (sharding != "hybrid" or not isinstance(shard_size, int) or shard_size < 1):
            raise ValueError(
                f"strategy.shard_size={shard_size!r}: only strategy.sharding=hybrid takes a shard size, an integer >= 1"
            )
        if min_num_params is not None and (not isinstance(min_num_params, int) or min_num_params < 1):
            raise ValueError(f"strategy.min_num_params={min_num_params!r} must be null or an integer >= 1")
        if not (isinstance(wrap, str) or all(isinstance(w, (str, type)) for w in wrap)):
            raise ValueError(f"strategy.wrap={wrap!r} must be 'auto', 'none' or a list of class names")
        if cpu_offload and not self.use_cuda():
            raise ValueError(
                "strategy.cpu_offload=true needs a CUDA device: FSDP2 moves shards between CPU and the accelerator, "
                f"and this run has accelerator={accelerator!r} with torch.cuda.is_available()={torch.cuda.is_available()}; "
                "set strategy.cpu_offload=false"
            )
        self.sharding = sharding
        self.shard_size = shard_size
        self.wrap_classes = wrap if isinstance(wrap, str) else list(wrap)
        self.min_num_params = min_num_params
        self.param_dtype = parse_dtype(param_dtype, "strategy.param_dtype")
        self.reduce_dtype = parse_dtype(reduce_dtype, "strategy.reduce_dtype")
        self.output_dtype = parse_dtype(output_dtype, "strategy.output_dtype")
        self.cpu_offload = cpu_offload
        self.meta_init = meta_init
        self.sync_every_microbatch = sync_every_microbatch
        self.mesh = None

    # ----- set-up ---------------------------------------------------------------------------------------
    def _group_size(self, world_size: int, devices_per_node: int) -> int:
        """Ranks per sharding group."""
        if self.sharding == "no_shard":
            return 1
        if self.sharding == "hybrid":
            return self.shard_size or devices_per_node
        return world_size

    def check_world_size(self, world_size: int, devices_per_node: int) -> None:
        size = self._group_size(world_size, devices_per_node)
        if world_size % size:
            raise ValueError(
                f"strategy.shard_size={size} does not divide the world size {world_size}; "
                f"choose a divisor of {world_size}: {[d for d in range(1, world_size + 1) if world_size % d == 0]}"
            )

    def setup_environment(self, env: ClusterEnvironment, timeout: timedelta) -> None:
        super().setup_environment(env, timeout)  # alone: a group of one (needs_process_group)
        from torch.distributed.device_mesh import init_device_mesh

        world = distributed.world_size()
        size = self._group_size(world, env.local_world_size)
        self.check_world_size(world, env.local_world_size)
        if self.sharding in ("full", "grad_op"):
            self.mesh = init_device_mesh(self.device.type, (world,), mesh_dim_names=("shard",))
        else:
            self.mesh = init_device_mesh(self.device.type, (world // size, size), mesh_dim_names=("replicate", "shard"))

    def configure_precision(self, precision: Any) -> None:
        """Mixed precision: gather parameters in the compute dtype, reduce gradients in fp32,
        unless ``param_dtype`` / ``reduce_dtype`` were set explicitly."""
        if getattr(precision, "mixed", False):
            if self.param_dtype is None:
                self.param_dtype = precision.compute_dtype
            if self.reduce_dtype is None:
                self.reduce_dtype = torch.float32

    def init_context(self) -> ContextManager:
        return torch.device("meta") if self.meta_init else contextlib.nullcontext()

    # ----- wrapping -------------------------------------------------------------------------------------
    def _shard_options(self) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        options: dict = {
            "mesh": self.mesh,
            "reshard_after_forward": self.sharding != "grad_op",
            "mp_policy": MixedPrecisionPolicy(
                param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype, output_dtype=self.output_dtype
            ),
        }
        if self.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        return options

    def check_module(self, module: nn.Module) -> None:
        # Units found from the module's own declarations (strategy.wrap=auto): it may say it has none.
        check = getattr(module, "check_sharding_units", None)
        if self.wrap_classes == "auto" and self.min_num_params is None and callable(check):
            check()

    def wrap(self, module: nn.Module, init: WeightInit | None = None) -> nn.Module:
        sharded = _sharded_root(module)
        if sharded is not None:  # fitted by FSDP earlier in this process: validate / test / predict it as it is
            return sharded
        if self.meta_init and not has_meta_tensors(module):
            rank_zero_warn(
                log, "strategy.meta_init=true but %s has no meta-device tensors: build the layers in "
                "configure_model(), not __init__, for it to take effect", type(module).__name__,
            )
        from torch.distributed.fsdp import fully_shard

        declared = module.block_classes() if hasattr(module, "block_classes") else ()
        units = select_units(module, self.wrap_classes, declared, self.min_num_params)
        manual = getattr(module, "automatic_optimization", True) is False
        if manual:
            units = units + _manual_units(module, units)
        log.info("FSDP sharding=%s, units: %s", self.sharding, describe_units(module, units))
        if not units:
            rank_zero_warn(
                log, "FSDP has a single unit (the whole model): every rank gathers all parameters in forward, so only "
                "the optimizer state and gradients are saved; declare TrainModule.block_classes() or set "
                "strategy.wrap / strategy.min_num_params"
            )
        options = self._shard_options()
        if has_meta_tensors(module):
            if init is None:
                raise ValueError("a meta-device model needs a WeightInit to materialise it")
            init.materialize(self.device, units, lambda unit: self._shard_unit(unit, options))
        else:
            # FSDP2 does not broadcast: ranks must start equal. Seeding makes them equal; this makes
            # sure of it (as DDP does) for models initialised from unseeded sources.
            self._make_ranks_equal(module)
            for unit in units:
                self._shard_unit(unit, options)
        outside = _root_owners(module, units)  # before fully_shard replaces the parameters
        root = self._root_forward(module)
        fully_shard(root, **options)
        _gather_when_called_outside_a_step(root, outside)
        if manual:
            # The root is initialised by its first forward; a unit called first (a hook calling
            # ``self(z)`` before any training step) would make itself the root. Do it now.
            root._get_fsdp_state()._lazy_init()
        # Kept in the module's __dict__ (not as a submodule): a later run of this module in this process
        # (Trainer.validate after fit under torchrun) reuses the sharding instead of sharding it twice.
        remember_root(module, root)
        return root

    def _make_ranks_equal(self, module: nn.Module) -> None:
        """Give every rank rank 0's weights (an eager build)."""
        _broadcast_from_rank0(module)

    def _shard_unit(self, unit: nn.Module, options: dict) -> None:
        """Make ``unit`` one FSDP unit (nd splits it for tensor parallelism first)."""
        from torch.distributed.fsdp import fully_shard

        fully_shard(unit, **options)

    def _root_forward(self, module: nn.Module) -> nn.Module:
        """The module the root unit wraps: what the loop calls for a step."""
        return TrainingStepForward(module)

    # ----- the step -------------------------------------------------------------------------------------
    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        from torch.distributed.fsdp import FSDPModule

        if self.sync_every_microbatch or not isinstance(wrapped, FSDPModule):
            return contextlib.nullcontext()
        # Applies to every unit. False: accumulate unsharded gradients, no reduce-scatter.
        wrapped.set_requires_gradient_sync(sync)
        if self.sharding == "grad_op":
            # As DeepSpeed stage 2: the parameters stay gathered through the accumulation window
            # (no reshard after the backward of a non-final micro-batch), so each unit is gathered
            # once per optimizer step; the final micro-batch's backward frees them.
            wrapped.set_reshard_after_backward(sync)
        return contextlib.nullcontext()

    def grad_norm(self, module: nn.Module) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        # The norm of sharded gradients is a partial result per rank; full_tensor() reduces it.
        total = super().grad_norm(module)
        return total.full_tensor() if isinstance(total, DTensor) else total

    def after_evaluation(self, wrapped: nn.Module) -> None:
        """Free the parameters an evaluation forward left gathered (the root keeps them otherwise)."""
        from torch.distributed.fsdp import FSDPModule

        for submodule in wrapped.modules():
            if isinstance(submodule, FSDPModule):
                submodule.reshard()

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Gathers one tensor at a time into rank 0's CPU memory; other ranks get {}.
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if distributed.rank() == 0 else {}


def _manual_units(module: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """Manual optimization: every parameter in a unit below the root.

    ``training_step`` runs inside the root's forward, and ``manual_backward`` runs inside it too:
    the root's own parameters would be gathered once for the whole step, their gradients never
    reduce-scattered before ``opt.step()`` (FSDP does that in the backward of a forward that has
    returned), and they stay gathered and stale into the next step. A unit's forward returns before
    each backward, so its gradients are reduce-scattered at every ``manual_backward``, whichever
    pattern the step uses (a network called several times, ``requires_grad`` toggled), and it
    gathers itself when a hook calls it outside the step (``self(z)`` at an epoch end). So the
    parameters no unit holds get units of their own (`leftover_units`); those the module holds
    itself (not through a submodule) cannot, and are refused."""
    own = own_parameters(module)
    if own:
        raise ValueError(
            f"manual optimization (automatic_optimization = False) under strategy=fsdp: the module holds the parameters "
            f"{own} itself, and FSDP cannot reduce their gradients at each manual_backward; move them into a submodule "
            "(e.g. an nn.Module holding them) or use strategy=ddp")
    return leftover_units(module, units)


def _root_owners(module: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """``module`` and the modules holding parameters that no unit holds (the root's own)."""
    taken = {id(p) for unit in units for p in unit.parameters()}
    owners = [m for m in module.modules() if any(id(p) not in taken for p in m.parameters(recurse=False))]
    return [module] + [m for m in owners if m is not module] if owners else []


def _gather_when_called_outside_a_step(root: nn.Module, owners: list[nn.Module]) -> None:
    """A forward of ``owners`` outside the root's forward (a hook calling ``self(z)`` or
    ``self.generator(z)`` at an epoch end) gathers the root's parameters for its duration, as a unit
    gathers its own: without this it would compute on shards ("mixed torch.Tensor and DTensor").
    Every rank must make the call, as for any FSDP forward."""
    group = root._get_fsdp_state()._fsdp_param_group
    if group is None or not owners:
        return
    depth, gathered = [0], [False]

    def before(module: nn.Module, args: Any) -> None:
        if depth[0] == 0 and not group.is_unsharded:  # inside a step the root holds them gathered
            root.unshard()
            gathered[0] = True
        depth[0] += 1

    def after(module: nn.Module, args: Any, output: Any) -> None:
        depth[0] -= 1
        if depth[0] == 0 and gathered[0]:
            gathered[0] = False
            root.reshard()

    for owner in owners:
        owner.register_forward_pre_hook(before)
        owner.register_forward_hook(after)


ROOT_KEY = "_fsdp_root_and_group"


def remember_root(module: nn.Module, root: nn.Module) -> None:
    """Keep ``root`` in the module's __dict__ (not as a submodule) with the process group it runs on,
    weakly: a module the caller keeps after its run must not keep the ended group (and its gloo
    threads) alive (trainer/runtime/distributed.py); a later run sees that the group has ended."""
    module.__dict__[ROOT_KEY] = (root, weakref.ref(torch.distributed.group.WORLD))


def _sharded_root(module: nn.Module) -> nn.Module | None:
    """The FSDP root of an earlier run of ``module`` in this process, if its process group still runs."""
    root, group = module.__dict__.get(ROOT_KEY, (None, None))
    if root is None:
        return None
    group = group()
    if group is None or group is not torch.distributed.group.WORLD:
        raise RuntimeError(
            f"{type(module).__name__} was sharded by FSDP in an earlier run whose process group has ended (its "
            "parameters are shards of that run): run validate / test / predict with ckpt_path= (the weights of a "
            "checkpoint), or call torch.distributed.init_process_group yourself before the first Trainer call so that "
            "one process group serves every run"
        )
    return root


def _broadcast_from_rank0(module: nn.Module) -> None:
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            torch.distributed.broadcast(tensor.data, src=0)
