"""Modules with a tensor-parallel plan for the dry-run and estimator tests.

``TPRegressor``: a tiny regression model of MLP blocks (norm, up projection split by columns, down
projection split by rows), sizes chosen uneven so that FSDP's padding and torch.chunk's short last
pieces show (10 hidden rows over tp 2 = 5 + 5, over dp_shard 2 = 3 + 2). ``LlamaWithPlan``: the
llama recipe with a Megatron-style plan written here (attention heads and SwiGLU split, embedding by
rows, the output projection by columns), for layouts of the recipe's own module names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from tests.support.helpers import BlockRegressor
from trainer.recipes.llama import LlamaModule


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


LLAMA_PLAN = {
    "model.tok_embeddings": RowwiseParallel(),
    "model.layers.*.attention.wq": ColwiseParallel(),
    "model.layers.*.attention.wk": ColwiseParallel(),
    "model.layers.*.attention.wv": ColwiseParallel(),
    "model.layers.*.attention.wo": RowwiseParallel(),
    "model.layers.*.feed_forward.w1": ColwiseParallel(),
    "model.layers.*.feed_forward.w3": ColwiseParallel(),
    "model.layers.*.feed_forward.w2": RowwiseParallel(),
    "model.output": ColwiseParallel(),
}


class LlamaWithPlan(LlamaModule):
    """The llama recipe's module with :data:`LLAMA_PLAN` (shapes only: the dry run never runs it)."""

    def tensor_parallel_plan(self):
        return dict(LLAMA_PLAN)
