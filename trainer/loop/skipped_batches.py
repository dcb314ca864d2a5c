"""``training_step`` returning None under automatic optimization: the batch is skipped, on one process.

As in Lightning, a skipped batch has no backward and no backward hooks and logs no loss; the step's
gradient zeroing, ``on_before_optimizer_step``, clipping, the optimizer step (over the gradients of
the step's other micro-batches: a parameter without a gradient does not move) and the schedule go on,
and the step counts in ``global_step``. Under fp16 loss scaling, as Lightning's 16-mixed: where the step's
last micro-batch is the skipped one, no optimizer step and no loss-scale update (the step's other
gradients are dropped; trainer/loop/train_step.py). On several ranks it is an error naming the rank and the batch:
every rank takes each step together, and agreeing on a skip that one rank chose would cost a collective
on every step (also on the steps that return a loss). Checking for None costs nothing on those: the
loss is read from the output anyway.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer.api.errors import MisconfigurationException
from trainer.runtime import distributed
from trainer.runtime.rank_logging import rank_zero_user_warning

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


class SkippedBatchError(RuntimeError):
    """``training_step`` returned None in a run of several ranks (a RuntimeError, as Lightning's)."""


class SkippedBatches:
    """Called with a ``training_step`` output that holds no loss; counts the micro-batch and returns the
    ``(loss, metrics, weight)`` of a skipped one, ``(None, {}, None)``, or raises."""

    def __init__(self, run: RankRun):
        self.run = run
        self.warned = False

    def __call__(self, output: Any) -> tuple[None, dict[str, Any], None]:
        run = self.run
        batch_idx = run.batch_idx
        run.micro_batch_done()
        if output is not None:  # (a dict without "loss")
            raise MisconfigurationException(
                f"training_step returned a dict without 'loss' at batch_idx {batch_idx}; under automatic optimization "
                "return a loss tensor, a dict with 'loss', or None to skip the batch (on one process)")
        world = distributed.world_size()
        if world > 1:
            raise SkippedBatchError(
                f"training_step returned None on rank {run.rank} at batch_idx {batch_idx} (epoch {run.epoch}) with "
                f"{world} ranks: skipping a batch is supported on one process only (every rank takes each step "
                "together, and agreeing on a skip would cost a collective on every step). Return a zero loss instead "
                "(e.g. `loss * 0`: a zero gradient, so momentum and weight decay still apply), or filter such "
                "samples out of the dataset")
        if not self.warned:
            self.warned = True
            rank_zero_user_warning(log, getattr(run.trainer, "lightning_warnings", False),
                                   f"training_step returned None at batch_idx {batch_idx}: the batch is skipped (no "
                                   "backward; the optimizer step and the schedule go on). Further skips are not "
                                   "reported")
        return None, {}, None
