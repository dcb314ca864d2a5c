"""The interface every strategy implements; the loop, validation and the checkpoints call only this.

A strategy decides the device, joins the process group, wraps the module for training and owns
everything that touches gradient synchronisation. Adding one = one Python file with a subclass of
``Strategy`` + one yaml in a ``strategy/`` config folder whose ``_target_`` names it (registry.py).

- ``Strategy``: what every strategy declares, grouped by concern (processes and devices; wrapping;
  the step; collectives; checkpoint state; teardown), each with a one-line contract. Subclasses
  override what they change.
- ``OptimizerStateIO``: the checkpoint's hooks for optimizers whose state lives elsewhere (ZeRO-1
  implements them; every other strategy inherits the no-op). ``trainer/checkpoint`` calls these;
  strategies never import ``trainer/checkpoint`` (layering: checkpoint -> strategies, never back).
- ``OwnedStep``: a strategy that runs each micro-batch's forward and backward itself (pipeline):
  ``run_step`` (the loop hands it each micro-batch: trainer/loop/pipeline_micro_batches.py, when
  ``owns_step`` is set), ``complete_metrics`` and ``evaluate`` (validation).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, ContextManager

import torch
from torch import nn

from trainer.api.batch_settings import BatchSettings
from trainer.api.hook_calls import call_step
from trainer.optim.grad_clipping import clip_grad_values
from trainer.runtime import distributed
from trainer.runtime.launch import ClusterEnvironment
from trainer.strategies.weight_init import WeightInit, has_meta_tensors


#: a context that does nothing (stateless: one object serves every step and every strategy)
NO_CONTEXT = contextlib.nullcontext()

class TrainingStepForward(nn.Module):
    """Makes ``training_step`` the forward of a module, so wrappers that hook the forward (DDP)
    see the user's whole step. Validation calls the module directly, outside any wrapper."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int, hook: str = "training_step", *dataloader_idx: int) -> Any:
        # ``hook="validation_step"``: strategies whose forward must run on every rank together
        # (FSDP gathers parameters in it) validate through the wrapper too (with several loaders,
        # their ``dataloader_idx``).
        return call_step(self.module, hook, batch, batch_idx, *dataloader_idx)


class OptimizerStateIO:
    """Checkpoint hooks for an optimizer whose state does not live in the optimizer the user built
    (ZeRO-1 shards it over the ranks). The defaults say "not mine": the checkpoint reads and fills
    ``optimizer`` itself (``torch.distributed.checkpoint.state_dict``)."""

    def optimizer_state_dict(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, full: bool
    ) -> dict[str, Any] | None:
        """A checkpoint's optimizer entry when the state does not live in ``optimizer`` itself; None:
        the checkpoint reads ``optimizer`` (``torch.distributed.checkpoint.state_dict``). The entry has
        that module's layout-free form (``{"state": {<param name>: {...}}, "param_groups": [...]}``).
        ``full``: all of it on rank 0, ``{}`` elsewhere; else this rank's part, which is also what a
        sharded load fills in place. A collective."""
        return None

    def load_optimizer_state_dict(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], full: bool
    ) -> bool:
        """Take a loaded optimizer entry (``full``: read by rank 0 only, ``{}`` elsewhere; else the
        entry ``optimizer_state_dict`` gave, filled). False: not handled here, the checkpoint loads
        it into ``optimizer``. A collective."""
        return False


class Strategy(OptimizerStateIO):
    """Base strategy: one process, one device. Subclasses override what they change."""

    # ----- processes and devices ---------------------------------------------------------------
    #: the name configs and ``Trainer(strategy=...)`` use (its yaml's file name)
    name = "base"
    #: whether trainer.devices > 1 makes sense (single-process strategies say False)
    supports_multiple_devices = False
    #: whether the strategy needs a process group even in one process (FSDP's sharding, pipeline stages)
    needs_process_group = False

    def __init__(self, accelerator: str = "auto"):
        if accelerator not in ("auto", "cpu", "cuda"):
            raise ValueError(f"accelerator={accelerator!r} is not one of 'auto', 'cpu', 'cuda'")
        # (accelerator="cuda" without a CUDA device: refused by the Trainer that gets the strategy, before any
        # worker starts: trainer_checks.check_accelerator)
        self.accelerator = accelerator
        self.env = ClusterEnvironment(launcher="none")
        #: this rank's device (set by ``setup_environment``)
        self.device = torch.device("cpu")
        #: the run's resolved batch settings (set by ``use_batch`` before ``wrap``; the pipeline splits its micro-batch)
        self.batch: BatchSettings | None = None

    def use_batch(self, batch: BatchSettings) -> None:
        """The run's resolved batch, before ``wrap`` (a strategy may split the micro-batch further)."""
        self.batch = batch

    def use_cuda(self) -> bool:
        """Whether this strategy trains on a GPU (``accelerator`` cuda, or auto with one present)."""
        return self.accelerator == "cuda" or (self.accelerator == "auto" and torch.cuda.is_available())

    def setup_environment(self, env: ClusterEnvironment, timeout: timedelta) -> None:
        """Pick this rank's device and join the process group."""
        self.env = env
        if self.use_cuda():
            self.device = torch.device("cuda", env.local_rank)
            torch.cuda.set_device(self.device)
        self._owns_process_group = distributed.init_process_group(
            env, distributed.default_backend(self.device), timeout
        )
        if self.needs_process_group and not distributed.is_distributed():
            # Alone, but the strategy's machinery needs a group: one of one, in-memory store.
            distributed.init_single_process_group(distributed.default_backend(self.device), timeout)
            self._owns_process_group = True

    @property
    def num_processes(self) -> int:
        """The run's processes on this machine (1 before the run starts); Lightning's name, which programs
        read to divide a per-machine batch size among their processes."""
        return self.env.local_world_size

    def check_world_size(self, world_size: int, devices_per_node: int) -> None:
        """Raise ValueError if this strategy cannot run on ``world_size`` processes (called by the
        Trainer before any worker starts, and again with the launcher's actual numbers)."""

    def check_batch_size(self, batch_size: int, world_size: int) -> None:
        """Raise ValueError if this strategy cannot split a per-rank micro-batch of ``batch_size`` on
        ``world_size`` processes (called by the Trainer before any worker starts, when
        ``data.batch_size`` is given)."""

    def data_parallel_size(self, world_size: int | None = None) -> int:
        """Ranks that each load different samples, and by how many the gradient sync averages, out of
        ``world_size`` (all of them but under pipeline parallelism, whose stages of one pipeline share a
        batch). ``None``: out of the current world (after ``setup_environment``). The one name for
        the data-parallel size (the loop's ``run.data_parallel_size`` holds it)."""
        return distributed.world_size() if world_size is None else world_size

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index among the data-parallel ranks (which samples it loads)."""
        return distributed.rank()

    @property
    def random_stream_rank(self) -> int:
        """Which rank's random stream this rank draws from once the model is built (dropout, the
        module's own draws): its own, unless ranks must draw alike. The ranks of one tensor-parallel
        group compute the same replicated activations, so they share their group's first rank's
        stream; else their dropout masks differ and the replicas drift apart silently."""
        return distributed.rank()

    # ----- wrapping ------------------------------------------------------------------------------
    #: why ``trainer.sync_batchnorm=true`` is refused with this strategy (None: it is supported)
    sync_batchnorm_refusal: str | None = None

    def init_context(self) -> ContextManager:
        """Context ``configure_model`` runs in (FSDP's meta_init: the meta device)."""
        return contextlib.nullcontext()

    def configure_precision(self, precision: Any) -> None:
        """Take note of the precision plugin (FSDP turns it into its mixed-precision policy)."""

    def check_module(self, module: nn.Module) -> None:
        """Raise ValueError if ``module`` cannot run under this strategy (called by the Trainer before
        any worker starts; must not change ``module``)."""

    def before_configure_model(self, module: nn.Module) -> None:
        """Called on every rank right before ``configure_model`` (nd hands the module its device mesh)."""

    def parallelize(self, module: nn.Module) -> None:
        """Split the built model across ranks before activation checkpointing, compile and ``wrap``
        (nd's tensor parallelism); called after the precision conversion."""

    def wrap(self, module: nn.Module, init: WeightInit | None = None) -> nn.Module:
        """Return what the loop calls as ``wrapped(batch, batch_idx)`` for a training step.
        ``module`` is on ``self.device``, or on the meta device, then ``init`` materialises it."""
        if has_meta_tensors(module):
            if init is None:
                raise ValueError(f"{type(module).__name__} has meta-device tensors and no WeightInit to materialise them")
            init.materialize(self.device, units=[], shard_unit=lambda unit: None)
        return TrainingStepForward(module)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Return the optimizer the loop steps (ZeRO-1 swaps in a sharded one)."""
        return optimizer

    # ----- the step ------------------------------------------------------------------------------
    #: whether the strategy runs a micro-batch's forward and backward itself (an ``OwnedStep``:
    #: ``run_step`` / ``evaluate`` replace ``training_step`` / ``validation_step`` in the loop)
    owns_step = False
    #: whether every rank must run the same number of forwards (collectives inside forward, as in
    #: FSDP); validation then pads short ranks with zero-weight batches and calls the wrapper
    lockstep_forward = False
    #: whether after the backward every rank holds the same full gradients (DDP's all-reduce): a
    #: value computed from them (fp16's overflow flag) is then equal on every rank without a collective
    gradients_replicated = False
    #: whether the optimizer state is sharded over the ranks (ZeRO-1: one optimizer only)
    zero1 = False
    #: gradient all-reduce bucket size in MB where the strategy buckets gradients (None: DDP's 25)
    bucket_cap_mb: float | None = None

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        """Context for one micro-batch's forward+backward; ``sync=False`` skips gradient sync."""
        return NO_CONTEXT

    def grad_norm(self, module: nn.Module) -> torch.Tensor:
        """The global 2-norm of all gradients (over every rank's shards where they are sharded)."""
        return torch.nn.utils.get_total_norm([p.grad for p in module.parameters() if p.grad is not None])

    def clip_grad_value(self, module: nn.Module, value: float) -> None:
        """Clamp every gradient element this rank holds to ``[-value, value]`` (element-wise: a shard
        alone is enough, no collective)."""
        clip_grad_values(module.parameters(), value)

    def clip_grad_norm(self, module: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip by the global norm over all parameters; returns the norm before clipping."""
        total = self.grad_norm(module)
        torch.nn.utils.clip_grads_with_norm_([p for p in module.parameters() if p.grad is not None], max_norm, total)
        return total

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer ``setup_optimizer`` returned."""
        optimizer.step()

    def after_evaluation(self, wrapped: nn.Module) -> None:
        """Called after a validation pass (FSDP frees the parameters it left gathered)."""

    def stepping_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer whose ``step()`` runs the update when `optimizer_step` steps ``optimizer``
        (fp16 sets its ``found_inf`` flag: trainer/precision/fp16_step.py)."""
        return optimizer

    # ----- collectives ---------------------------------------------------------------------------
    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """Max of ``tensor`` over every rank of the world (in place when distributed)."""
        if distributed.is_distributed():
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over every rank of the world (in place when distributed), not only the
        data-parallel ranks: under pipeline parallelism the stages that hold no value of it (no
        loss, no token count) contribute zeros, so the world sum is the data-parallel sum."""
        if distributed.is_distributed():
            torch.distributed.all_reduce(tensor)
        return tensor

    # ----- checkpoint state (the optimizer's: OptimizerStateIO) ----------------------------------
    #: checkpoint formats the strategy can save and resume from (see CheckpointConfig.format)
    checkpoint_formats = ("sharded", "full")

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The module's full (unsharded) state dict on the CPU, on rank 0; ``{}`` on other ranks.
        A collective: call it on every rank."""
        if distributed.rank() != 0:
            return {}
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}

    # ----- teardown ------------------------------------------------------------------------------
    def teardown(self, clean: bool = True) -> None:
        """Leave the process group if this strategy created it (not the one ``train.py`` keeps
        across the jobs of a multirun under torchrun). ``clean=False``: after an error."""
        if getattr(self, "_owns_process_group", False):
            distributed.destroy_process_group(clean)
            self._owns_process_group = False
        # A destroyed group's gloo threads end only once nothing references it, and a strategy the
        # user keeps would: drop what holds one (see trainer/runtime/distributed.py).
        for name in self.group_holders:
            setattr(self, name, None)

    #: attributes that hold process groups (or meshes, stages, optimizers that do), dropped by teardown
    group_holders: tuple[str, ...] = ()


class OwnedStep(Strategy):
    """A strategy that runs each micro-batch's forward and backward itself (pipeline parallel): the
    loop calls these instead of the module's ``training_step`` / ``validation_step``."""

    owns_step = True

    def run_step(self, batch: Any, num_real: int, scale: float, sync: bool, sums: Any,
                 precision: Any, by_tokens: bool = False) -> tuple[Any, list[torch.Tensor]]:
        """Forward and backward of one of the loop's micro-batches (``num_real`` samples count;
        ``scale``: the factor per real sample; ``sync``: the step's last micro-batch); adds the
        metrics to ``sums``. Returns (this rank's token count or None, the detached losses). No host sync."""
        raise NotImplementedError

    def complete_metrics(self, sums: Any) -> None:
        """Make ``sums`` hold the same metric names on every rank before the loop reduces them."""
        raise NotImplementedError

    def evaluate(self, batch: Any, precision: Any, num_real: int | None = None) -> list:
        """Forward only over a validation batch: ``[(weight, metrics)]`` (empty where no loss is computed)."""
        raise NotImplementedError
