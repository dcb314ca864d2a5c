"""What evaluation batches log under ``trainer.lightning`` on 2 ranks (the trainer spawns them) equals
one process at the same global batches: each loader's per-batch rows at its own batch count, and the
progress bar's share of a callback's per-batch values. The one-process runs are checked against
Lightning itself in tests/unit/api/test_lightning_eval_step_rows.py."""

from __future__ import annotations

import json

import pytest

import trainer.lightning as L
from tests.support.lightning_eval_rows_modules import LoadersStep, StepLogsInHooksCallback
from tests.support.lightning_loop_modules import Recording, run_call

pytestmark = pytest.mark.timeout(600)
TWO_RANKS = dict(strategy="ddp", devices=2, accelerator="cpu")


def test_each_loaders_rows_and_the_progress_bar_on_two_ranks_as_one_process(tmp_path):
    # Loader 0 (5 samples) ends with a global batch of rank 0 alone; loader 1 has 3 samples.
    seen = {}
    for ranks, flags in ((1, {}), (2, TWO_RANKS)):
        path = str(tmp_path / f"{ranks}.jsonl")
        module = LoadersStep(batch_size=4 // ranks, eval_batch=2 // ranks, loaders=2)
        trainer, _ = run_call(L, module, "fit", str(tmp_path / str(ranks)), max_epochs=2, logger=Recording(path),
                              callbacks=[StepLogsInHooksCallback()], **flags)
        bar = dict(trainer.progress_bar_metrics)
        trainer.test(module, verbose=False)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        seen[ranks] = (rows, bar)
    (rows_one, bar_one), (rows_two, bar_two) = seen[1], seen[2]
    assert rows_two == [pytest.approx(row, rel=1e-5) for row in rows_one]
    assert [row["step"] for row in rows_one if "vstep/dataloader_idx_1" in row] == [0, 1, 3]
    assert [row["step"] for row in rows_one if "tstep/dataloader_idx_0" in row] == [0, 1, 2]
    assert bar_two == pytest.approx(bar_one, rel=1e-6) and "batch_end_10/dataloader_idx_1" in bar_one
