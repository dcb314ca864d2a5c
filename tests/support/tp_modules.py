"""Test modules with tensor-parallel plans of their own.

- ``TPRegressor`` (the dry-run and estimator tests): a tiny regression model of MLP blocks (norm, up
  projection split by columns, down projection split by rows), sizes chosen uneven so that FSDP's
  padding and torch.chunk's short last pieces show (10 hidden rows over tp 2 = 5 + 5, over dp_shard 2
  = 3 + 2).
- ``KilledTokenClassifier`` (tests/multiprocess/checkpoint/test_nd_checkpoints.py): strategy=nd's test
  module (tests/support/nd_modules.py ``TokenClassifier``: its own plan, sequence parallel and loss
  parallel) made to lose a rank mid-run, as a job loses a node, for the kill -9 + resume tests.
"""

from __future__ import annotations

import os
import signal

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from tests.support.helpers import BlockRegressor
from tests.support.nd_modules import MLPBlock, TokenClassifier


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


class KilledTokenClassifier(TokenClassifier):
    """A TokenClassifier whose rank ``kill_rank`` dies (SIGKILL) after step ``kill_at_step``, once the
    last save committed; the launcher then stops the other ranks."""

    def __init__(self, kill_at_step: int | None = None, kill_rank: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.kill_at_step, self.kill_rank = kill_at_step, kill_rank

    def on_train_step_end(self, step, metrics):
        if step != self.kill_at_step:
            return
        from trainer.checkpoint import layout

        # Rank 0 commits in a thread: every rank waits until its commit landed, then one dies.
        layout.settle(os.path.join(self.trainer.run_dir, "checkpoints"))
        torch.distributed.barrier()
        if torch.distributed.get_rank() == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
