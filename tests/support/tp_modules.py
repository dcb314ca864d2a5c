"""strategy=nd's test module (tests/support/nd_modules.py ``TokenClassifier``: a module of one's own with
its own tensor-parallel plan, sequence parallel and loss parallel) made to lose a rank mid-run, as a
job loses a node: for the kill -9 + resume tests of tests/multiprocess/checkpoint/test_nd_checkpoints.py."""

from __future__ import annotations

import os
import signal

import torch

from tests.support.nd_modules import TokenClassifier


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
