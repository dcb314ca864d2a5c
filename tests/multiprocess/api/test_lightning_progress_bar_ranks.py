"""``trainer.progress_bar_metrics`` after a fit on 2 DDP ranks (spawned: the names come back with the
run's result) equal one process's: the same names, the same values (rel 1e-6)."""

from __future__ import annotations

import pytest

import trainer.lightning as L
from tests.unit.api.test_lightning_progress_bar import Bar

pytestmark = pytest.mark.timeout(600)


def test_progress_bar_metrics_on_two_ranks_equal_one_process(tmp_path):
    metrics = {}
    for devices in (1, 2):
        flags = dict(strategy="ddp", devices=2, accelerator="cpu") if devices == 2 else {}
        trainer = L.Trainer(default_root_dir=str(tmp_path / str(devices)), max_epochs=2, limit_val_batches=3,
                            num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                            enable_model_summary=False, **flags)
        trainer.fit(Bar())
        metrics[devices] = trainer.progress_bar_metrics
    assert set(metrics[1]) == {"loss_bar", "both_bar_step", "both_bar_epoch", "epoch_bar", "val_bar"}
    assert set(metrics[2]) == set(metrics[1])
    for name, value in metrics[1].items():
        assert metrics[2][name] == pytest.approx(value, rel=1e-6), name
