"""A module with a tensor-parallel plan of its own for the dry-run and estimator tests.

``TPRegressor``: a tiny regression model of MLP blocks (norm, up projection split by columns, down
projection split by rows), sizes chosen uneven so that FSDP's padding and torch.chunk's short last
pieces show (10 hidden rows over tp 2 = 5 + 5, over dp_shard 2 = 3 + 2).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from tests.support.helpers import BlockRegressor


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class TPRegressor(BlockRegressor):
    """BlockRegressor with MLP blocks and a TP plan (up: columns, down: rows); AdamW."""

    def __init__(self, width: int = 6, hidden: int = 10, depth: int = 2, **kwargs):
        super().__init__(width=width, depth=depth, **kwargs)
        self.hidden = hidden

    def configure_model(self):
        self.inp = nn.Linear(6, self.width)
        self.blocks = nn.ModuleList(MLPBlock(self.width, self.hidden) for _ in range(self.depth))
        self.out = nn.Linear(self.width, 1)

    def block_classes(self):
        return (MLPBlock,)

    def tensor_parallel_plan(self):
        return {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def check_tensor_parallel(self, tp: int) -> None:
        if self.hidden % tp:
            raise ValueError(f"TPRegressor: hidden={self.hidden} is not divisible by tp={tp}")
