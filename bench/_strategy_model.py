"""What bench/strategy_baselines.py trains, shared by the hand-written loops and the trainer: equal
residual MLP blocks (so a uniform pipeline cut, FSDP's per-block units and a column / row tensor
split all apply), random regression data, AdamW. Torch only: the hand-written loops import neither
the trainer nor Lightning."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

GLOBAL_BATCH = 64
ACCUMULATE = 2  # data-parallel strategies: 2 micro-batches per step (the first without a gradient sync)
MICROBATCHES = 4  # pipeline: pieces of each step's batch
LR = 1e-3
LOG_EVERY = 50


class Block(nn.Module):
    """x + down(gelu(up(norm(x)))): ``up`` splits by columns, ``down`` by rows under tensor parallel."""

    def __init__(self, width: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def blocks(width: int, depth: int) -> nn.ModuleList:
    """``depth`` blocks, the same initial weights in every contender and on every rank."""
    torch.manual_seed(0)
    return nn.ModuleList(Block(width) for _ in range(depth))


def dataset(width: int, steps: int) -> TensorDataset:
    """One epoch of ``steps`` global batches of random inputs and targets, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    samples = steps * GLOBAL_BATCH
    return TensorDataset(torch.randn(samples, width, generator=generator), torch.randn(samples, width, generator=generator))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)
