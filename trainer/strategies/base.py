"""The small interface every strategy implements; the trainer loop talks only to this.

A strategy decides the device, joins the process group, wraps the module for training and
owns everything that touches gradient synchronisation. Adding one = one file in this package
that defines ``STRATEGY`` + one yaml in ``conf/strategy/``.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, ContextManager

import torch
from torch import nn

from trainer import distributed
from trainer.launch import ClusterEnvironment


class TrainingStepForward(nn.Module):
    """Makes ``training_step`` the forward of a module, so wrappers that hook the forward (DDP)
    see the user's whole step. Validation calls the module directly, outside any wrapper."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> Any:
        return self.module.training_step(batch, batch_idx)


class Strategy:
    """Base strategy: one process, one device. Subclasses override what they change."""

    name = "base"
    #: whether trainer.devices > 1 makes sense (single-process strategies say False)
    supports_multiple_devices = False

    def __init__(self, accelerator: str = "auto"):
        if accelerator not in ("auto", "cpu", "cuda"):
            raise ValueError(f"accelerator={accelerator!r} is not one of 'auto', 'cpu', 'cuda'")
        if accelerator == "cuda" and not torch.cuda.is_available():
            raise ValueError("accelerator='cuda' but torch.cuda.is_available() is False on this machine")
        self.accelerator = accelerator
        self.env = ClusterEnvironment(launcher="none")
        self.device = torch.device("cpu")

    # ----- lifecycle ---------------------------------------------------------------------------
    def use_cuda(self) -> bool:
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

    def wrap(self, module: nn.Module) -> nn.Module:
        """Return what the loop calls as ``wrapped(batch, batch_idx)`` for a training step."""
        return TrainingStepForward(module)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Return the optimizer the loop steps (ZeRO-1 swaps in a sharded one)."""
        return optimizer

    def teardown(self, clean: bool = True) -> None:
        """Leave the process group if this strategy created it (not the one ``train.py`` keeps
        across the jobs of a multirun under torchrun). ``clean=False``: after an error."""
        if getattr(self, "_owns_process_group", False):
            distributed.destroy_process_group(clean)
            self._owns_process_group = False

    # ----- the step ------------------------------------------------------------------------------
    @property
    def gradient_average_size(self) -> int:
        """By how many ranks the gradient sync divides (1 without data parallelism)."""
        return 1

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        """Context for one micro-batch's forward+backward; ``sync=False`` skips gradient sync."""
        return contextlib.nullcontext()

    def clip_grad_norm(self, module: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip by the global norm over all parameters; returns the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the data-parallel ranks (in place when distributed)."""
        if distributed.is_distributed():
            torch.distributed.all_reduce(tensor)
        return tensor
