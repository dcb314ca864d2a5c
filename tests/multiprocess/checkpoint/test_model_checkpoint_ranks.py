"""Lightning's ModelCheckpoint on 2 DDP ranks: the same checkpoints kept, by epoch, as in one process, and
``best_model_path`` / ``best_model_score`` read in the caller after the workers trained."""

from __future__ import annotations

import os

import pytest

from tests.unit.callbacks.test_model_checkpoint import VAL_LOSSES, kept_steps, ours
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.checkpoint import layout

pytestmark = pytest.mark.timeout(240)


def test_two_ranks_keep_the_best_epochs_and_the_newest(tmp_path):
    callback = ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True)
    ours(tmp_path, [callback], strategy="ddp", devices=2)  # 16 samples, 8 a rank: one step an epoch
    ranked = sorted(range(len(VAL_LOSSES)), key=VAL_LOSSES.__getitem__)
    assert kept_steps(tmp_path / "checkpoints") == sorted({ranked[0] + 1, ranked[1] + 1, len(VAL_LOSSES)})
    assert callback.best_model_path == os.path.join(str(tmp_path), "checkpoints", layout.checkpoint_name(ranked[0] + 1))
    assert float(callback.best_model_score) == pytest.approx(min(VAL_LOSSES))
    assert callback.last_model_path.endswith(layout.checkpoint_name(len(VAL_LOSSES)))
