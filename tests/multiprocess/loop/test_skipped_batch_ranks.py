"""``training_step`` returning None on several ranks (skipping a batch is supported on one process:
tests/unit/api/test_lightning_skipped_batches.py): one clear error naming the rank and the batch and
what to do instead, and the job ends on every rank well before the collective timeout (the other rank,
waiting in the gradient all-reduce, is stopped by the launcher)."""

from __future__ import annotations

import time

import pytest

from tests.support.helpers import Regressor, run_trainer
from trainer.runtime.launch import WorkerFailed

pytestmark = pytest.mark.timeout(300)

TIMEOUT_S = 120  # bounds a wait in a collective; the error ends the job well before it


class SkipsOnRankOne(Regressor):
    """Returns None on rank 1 at batch_idx 2 only."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 2:
            return None
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("accumulate, log_every", [(1, 50), (2, 1)])  # a quiet step; a logging step's micro-batch
def test_none_on_one_rank_is_one_error_naming_the_rank_and_batch(tmp_path, accumulate, log_every):
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        run_trainer(tmp_path, SkipsOnRankOne(), strategy="ddp", devices=2, batch_size=8, max_steps=6,
                    accumulate_grad_batches=accumulate, log_every_n_steps=log_every, collective_timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "rank 1 failed: SkippedBatchError: training_step returned None on rank 1 at batch_idx 2 (epoch 0) " \
           "with 2 ranks: skipping a batch is supported on one process only" in message, message
    assert "Return a zero loss instead (e.g. `loss * 0`" in message and "filter such samples out" in message, message
    assert elapsed < TIMEOUT_S, (elapsed, message)
