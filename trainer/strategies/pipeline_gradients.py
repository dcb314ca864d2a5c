"""Gradients under ``strategy=pipeline``: the once-per-step data-parallel average of a stage's
gradients (``data_parallel=ddp``), and the global norm over every stage (for clipping)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from trainer.runtime.comms_log import GRADIENT_KIND, labelled


def average_over_replicas(parameters: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Average the gradients over the stage's ``size`` replicas (``group``): one flat all-reduce,
    after the step's last backward (no overlap with it)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with labelled(GRADIENT_KIND):  # for the comms log
        torch.distributed.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def pipeline_grad_norm(parameters: Sequence[nn.Parameter], pp_group: Any, device: torch.device) -> torch.Tensor:
    """The 2-norm over every stage's gradients (each stage's squares summed over the pipeline;
    the replicas hold equal gradients, so the pipeline group suffices)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)
    if isinstance(norm, DTensor):  # a partial norm per replica's shard
        norm = norm.full_tensor()
    squares = norm.to(torch.float64) ** 2
    if pp_group is not None:
        torch.distributed.all_reduce(squares, group=pp_group)
    return squares.sqrt().to(torch.float32)


def scale_gradients(parameters: Sequence[nn.Parameter], total: torch.Tensor, max_norm: float) -> None:
    """Clip: scale every gradient by ``max_norm / total`` when that is below 1."""
    factor = min(1.0, max_norm / (float(total) + 1e-6))  # a float multiplies plain and sharded grads alike
    if factor < 1.0:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(factor)
