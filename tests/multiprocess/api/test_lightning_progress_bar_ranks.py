"""``trainer.progress_bar_metrics`` after a fit on 2 DDP ranks (spawned: the names come back with the
run's result) equal one process's on the same global batches: the same names, the same values (rel 1e-6)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import trainer.lightning as L
from tests.unit.api.test_lightning_progress_bar import Bar

pytestmark = pytest.mark.timeout(600)


class HalfBatches(Bar):
    """Bar's data with each loader's batch halved: on 2 ranks (a DataLoader's batch is per rank, as
    Lightning's) the global batches of one process's Bar."""

    def train_dataloader(self):
        loader = super().train_dataloader()
        return DataLoader(loader.dataset, batch_size=loader.batch_size // 2)

    def val_dataloader(self):
        loader = super().val_dataloader()
        return DataLoader(loader.dataset, batch_size=loader.batch_size // 2)


def test_progress_bar_metrics_on_two_ranks_equal_one_process(tmp_path):
    metrics = {}
    for devices in (1, 2):
        flags = dict(strategy="ddp", devices=2, accelerator="cpu") if devices == 2 else {}
        trainer = L.Trainer(default_root_dir=str(tmp_path / str(devices)), max_epochs=2,
                            num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                            enable_model_summary=False, **flags)
        trainer.fit(Bar() if devices == 1 else HalfBatches())  # the same global batches
        metrics[devices] = trainer.progress_bar_metrics
    assert set(metrics[1]) == {"loss_bar", "both_bar_step", "both_bar_epoch", "epoch_bar", "val_bar"}
    assert set(metrics[2]) == set(metrics[1])
    for name, value in metrics[1].items():
        assert metrics[2][name] == pytest.approx(value, rel=1e-6), name
