"""Distributed data parallel, optionally with ZeRO-1 optimizer-state sharding."""

from __future__ import annotations

import inspect
from typing import ContextManager

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.runtime import distributed
from trainer.strategies import zero1_state
from trainer.strategies.base import NO_CONTEXT, Strategy
from trainer.strategies.weight_init import WeightInit


class DDPStrategy(Strategy):
    """Replicate the model on every rank and average gradients with bucketed all-reduce.

    Args:
        find_unused_parameters: allow parameters that get no gradient in a step (costs a graph walk).
        static_graph: promise the same used parameters every step (lets DDP skip that walk and
            overlap better; needed for some activation-checkpointing set-ups).
        gradient_as_bucket_view: gradients are views into the all-reduce buckets (saves one copy
            of the gradients' memory).
        bucket_cap_mb: all-reduce bucket size; None keeps DDP's default.
        broadcast_buffers: sync buffers (e.g. BatchNorm running stats) from rank 0 every forward.
        zero1: shard optimizer state over the ranks with ZeroRedundancyOptimizer (ZeRO stage 1).
    """

    name = "ddp"
    supports_multiple_devices = True
    #: DDP all-reduces every gradient (ZeRO-1 too: it shards only the optimizer state), and an
    #: all-reduce leaves the same result on every rank
    gradients_replicated = True
    group_holders = ("_zero_optimizer",)

    def __init__(
        self,
        accelerator: str = "auto",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = True,
        bucket_cap_mb: float | None = None,
        broadcast_buffers: bool = True,
        zero1: bool = False,
    ):
        super().__init__(accelerator)
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.bucket_cap_mb = bucket_cap_mb
        self.broadcast_buffers = broadcast_buffers
        self.zero1 = zero1
        self._zero_optimizer: torch.optim.Optimizer | None = None

    def wrap(self, module: nn.Module, init: WeightInit | None = None) -> nn.Module:
        step_forward = super().wrap(module, init)
        if not distributed.is_distributed():
            return step_forward
        options: dict = {} if self.bucket_cap_mb is None else {"bucket_cap_mb": self.bucket_cap_mb}
        # torch 2.13 renamed broadcast_buffers (deprecated) to forward_sync_buffers; older ones lack it.
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
            options["forward_sync_buffers"] = self.broadcast_buffers
        else:
            options["broadcast_buffers"] = self.broadcast_buffers
        return DistributedDataParallel(  # (the comms log sees its reducer's all-reduces: trainer/runtime/comms_log.py)
            step_forward,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=self.find_unused_parameters,
            static_graph=self.static_graph,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            **options,
        )

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        if sync or not isinstance(wrapped, DistributedDataParallel):
            return NO_CONTEXT
        return wrapped.no_sync()

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if not (self.zero1 and distributed.is_distributed()):
            return optimizer
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Hand over the user's param-group dicts themselves: a scheduler built on the user's
        # optimizer writes the learning rate into these dicts, and ZeRO reads it from them.
        # ``defaults`` can hold keys the constructor does not take (AdamW's decoupled_weight_decay).
        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        self._zero_optimizer = ZeroRedundancyOptimizer(
            optimizer.param_groups, optimizer_class=type(optimizer), **defaults
        )
        return optimizer

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._zero_optimizer is None:
            optimizer.step()
            return
        self._zero_optimizer.step()
        # The LR scheduler checks that "its" optimizer stepped before it; the ZeRO one did.
        optimizer._opt_called = True  # type: ignore[attr-defined]

    def stepping_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        # ZeRO-1 steps its local optimizer (over this rank's shard), of the user's class and options.
        return optimizer if self._zero_optimizer is None else self._zero_optimizer.optim

    # ZeRO-1 keeps each rank's share of the optimizer state in its own optimizer: checkpoints save and
    # load each rank's share where it is, keyed by parameter name like every strategy's optimizer
    # state (trainer/strategies/zero1_state.py), so the full state is never built on every rank.
    def optimizer_state_dict(self, module: nn.Module, optimizer: torch.optim.Optimizer, full: bool) -> dict | None:
        if self._zero_optimizer is None:
            return None
        if full:
            return zero1_state.gather_full_state_dict(self._zero_optimizer, module, optimizer)
        return zero1_state.sharded_state_dict(self._zero_optimizer, module, optimizer)

    def load_optimizer_state_dict(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict, full: bool
    ) -> bool:
        if self._zero_optimizer is None:
            return False
        if full:
            zero1_state.load_full_state_dict(self._zero_optimizer, module, optimizer, state)
        else:
            zero1_state.load_sharded_state_dict(self._zero_optimizer, module, optimizer, state)
        return True
