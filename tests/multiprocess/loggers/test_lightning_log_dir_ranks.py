"""The mirror's default logger on 2 ranks: every rank reads rank 0's ``trainer.log_dir`` during the
run, only rank 0 writes (one ``lightning_logs/version_0`` holding the events, ``hparams.yaml`` and the
trainer's ``metrics.jsonl``, each logged step once), and the logged losses are those of one process."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L

pytestmark = pytest.mark.timeout(600)


class Regression(L.LightningModule):
    """A linear layer on 16 fixed samples, global batches of 8 (4 per rank on 2 ranks)."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        expected = os.path.join(self.trainer.default_root_dir, "lightning_logs", "version_0")
        assert self.trainer.log_dir == expected, (self.global_rank, self.trainer.log_dir)
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        x = torch.arange(32, dtype=torch.float32).reshape(16, 2) / 10
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)


def _losses(root: str, devices: int) -> list[float]:
    flags = dict(strategy="ddp", devices=2, accelerator="cpu") if devices == 2 else {}
    trainer = L.Trainer(default_root_dir=root, max_steps=4, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1, **flags)
    trainer.fit(Regression(batch_size=8 // devices))
    assert trainer.log_dir == os.path.join(root, "lightning_logs", "version_0")
    assert os.listdir(os.path.join(root, "lightning_logs")) == ["version_0"]
    files = os.listdir(trainer.log_dir)
    assert "hparams.yaml" in files and sum(name.startswith("events.out.tfevents.") for name in files) == 1
    with open(os.path.join(trainer.log_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if "loss" in line]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    return [row["loss"] for row in rows]


def test_two_ranks_log_once_into_rank_zeros_version_folder(tmp_path):
    one = _losses(str(tmp_path / "one"), 1)
    two = _losses(str(tmp_path / "two"), 2)
    assert two == pytest.approx(one, rel=1e-6)  # fp32 on CPU: the same global batches, reduced exactly
