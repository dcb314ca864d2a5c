"""A module of one's own (not a recipe) with its own tensor-parallel plan, for the strategy=nd tests.

``TPRegressor`` is the checkpoint tests' regressor (``CheckpointedRegressor``: it can die at a step, it
saves its full final parameters to ``<run_dir>/params.pt``) whose blocks are a small MLP split the
Megatron way: ``up`` column-wise, ``down`` row-wise, so the activation between them stays sharded over
the tensor-parallel ranks and ``down``'s output is whole again (summed over them) before the residual.
"""

from __future__ import annotations

import os
import signal

import torch
from torch import nn

from tests.support.helpers import CheckpointedRegressor


class TPBlock(nn.Module):
    """``x + dropout(down(tanh(up(norm(x)))))``: ``up`` widens by 2, ``down`` comes back."""

    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(torch.tanh(self.up(self.norm(x)))))


class TPRegressor(CheckpointedRegressor):
    """Regression through ``depth`` TPBlocks between an input and an output projection (those two stay
    whole on every tensor-parallel rank). No dropout by default: runs on other layouts are compared
    with it, and their random streams differ by design.

    ``kill_rank``: with ``kill_at_step``, only that rank dies (SIGKILL) after the step, once the last
    save committed; the launcher then stops the others, as after a node failure."""

    def __init__(self, kill_rank: int | None = None, **kwargs):
        kwargs.setdefault("dropout", 0.0)
        kwargs.setdefault("width", 16)
        kwargs.setdefault("depth", 2)
        super().__init__(**kwargs)
        self.kill_rank = kill_rank

    def configure_model(self):
        self.inp = nn.Linear(6, self.width)
        self.blocks = nn.ModuleList(TPBlock(self.width, self.dropout) for _ in range(self.depth))
        self.out = nn.Linear(self.width, 1)

    def block_classes(self):
        return (TPBlock,)

    def tensor_parallel_plan(self):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}

    def on_train_step_end(self, step, metrics):
        if self.kill_rank is None:
            return super().on_train_step_end(step, metrics)
        if step != self.kill_at_step:
            return
        from trainer.checkpoint import layout

        # Rank 0 commits in a thread: every rank waits until it has, then one dies.
        layout.settle(os.path.join(self.trainer.run_dir, "checkpoints"))
        torch.distributed.barrier()
        if torch.distributed.get_rank() == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
