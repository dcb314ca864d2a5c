"""Manual optimization on several ranks: ranks whose ``opt.step()`` counts part stop with one error,
on every rank, naming each rank's count, instead of waiting in a collective until its timeout."""

from __future__ import annotations

import re
import time

import pytest

from tests.support.helpers import run_trainer
from tests.support.manual_modules import StoppingGAN, UnevenStepsGAN
from trainer.strategies.ddp import DDPStrategy

pytestmark = pytest.mark.timeout(300)

TIMEOUT_S = 60  # bounds a wait in a collective; the error comes well before it


@pytest.mark.parametrize("from_batch, max_steps, log_every, expected", [
    # from the first batch, max_steps bound (rank 1 would foresee its last batch at batch 4, rank 0 at
    # batch 8): after the first batch, a quiet one
    (0, 8, 4, "by batch 1 (global_step per rank: rank 0: 1; rank 1: 2)"),
    # from the third batch, bounded by epochs only: at that logging step
    (2, -1, 3, "by batch 3 (global_step per rank: rank 0: 3; rank 1: 4)"),
])
def test_unequal_step_counts_name_the_ranks_and_counts(tmp_path, from_batch, max_steps, log_every, expected):
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        run_trainer(tmp_path, UnevenStepsGAN(from_batch=from_batch), strategy=DDPStrategy(), devices=2,
                    batch_size=8, max_steps=max_steps, max_epochs=1 if max_steps < 0 else None,
                    log_every_n_steps=log_every, collective_timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "called opt.step() a different number of times " + expected in message, message
    # raised on both ranks (the launcher names the first and the ranks that failed after it)
    assert re.search(r"rank [01] failed: RuntimeError: manual optimization: .*rank\(s\) \[[01]\] failed after it",
                     message), message
    assert elapsed < TIMEOUT_S, (elapsed, message)


def test_should_stop_on_one_rank_still_stops_every_rank_with_the_counts_compared(tmp_path):
    # The logging step's agreement carries both the stop flag and the counts: set on rank 1 after
    # batch 3, every rank stops at logging step 4 with equal counts.
    run_trainer(tmp_path, StoppingGAN(out=str(tmp_path)), strategy=DDPStrategy(), devices=2, batch_size=8,
                max_steps=12, log_every_n_steps=2, collective_timeout_s=TIMEOUT_S)
    assert [(tmp_path / f"final_step_rank{r}.txt").read_text() for r in (0, 1)] == ["4", "4"]
