"""Gradients under ``strategy=pipeline``: the once-per-step data-parallel average of a stage's
gradients (``data_parallel=ddp``), and the global norm over every stage, replica and
tensor-parallel shard (for clipping and the logged norm)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from trainer.runtime.comms_log import GRADIENT_KIND, labelled


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``tensor``: a DTensor's local tensor (a view of its storage), else itself."""
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def average_over_replicas(parameters: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """Average the gradients over the stage's ``size`` replicas (``group``): one flat all-reduce,
    after the step's last backward (no overlap with it). Tensor-parallel gradients are averaged
    piece by piece (each replica's group holds the ranks of one tensor-parallel coordinate)."""
    grads = [local_tensor(p.grad) for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with labelled(GRADIENT_KIND):  # for the comms log
        torch.distributed.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _squares(grad: torch.Tensor, stage_ranks: int) -> torch.Tensor:
    """This rank's share of ``grad``'s squared norm: its piece's squares divided by the number of
    the stage's ``stage_ranks`` ranks that hold the same piece (replicas, tensor-parallel copies),
    so that the sum over the world counts every element once."""
    from torch.distributed.tensor import DTensor, Replicate

    pieces = 1
    if isinstance(grad, DTensor):
        if any(p.is_partial() for p in grad.placements):  # pending sums: settle them first
            grad = grad.redistribute(grad.device_mesh, [Replicate() if p.is_partial() else p for p in grad.placements])
        # Split along every mesh dimension that does not replicate it (Shard, and FSDP's strided
        # shard over tensor-parallel pieces, which is no Shard subclass).
        pieces = math.prod(grad.device_mesh.size(i) for i, p in enumerate(grad.placements) if not p.is_replicate())
        grad = grad._local_tensor
    return grad.to(torch.float64).pow(2).sum() / (stage_ranks // pieces)


def pipeline_grad_norm(parameters: Sequence[nn.Parameter], stage_ranks: int, device: torch.device) -> torch.Tensor:
    """The 2-norm over every stage's gradients: each rank's share of the squares (`_squares`;
    ``stage_ranks``: the ranks of one stage, replicas x tensor-parallel ranks), summed over the world."""
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for p in parameters:
        if p.grad is not None:
            squares += _squares(p.grad, stage_ranks)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(squares)
    return squares.sqrt().to(torch.float32)


def scale_gradients(parameters: Sequence[nn.Parameter], total: torch.Tensor, max_norm: float) -> None:
    """Clip: scale every gradient by ``max_norm / total`` when that is below 1."""
    factor = min(1.0, max_norm / (float(total) + 1e-6))  # a float multiplies plain and sharded grads alike
    if factor < 1.0:
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.mul_(factor)
