"""The mirror's ModelCheckpoint on 2 ranks: DDP writes the same Lightning checkpoint files as one process
at the same global batch, and a resume from a ``.ckpt`` file trains as the uninterrupted one-process
run; FSDP writes consolidated files too. One process against Lightning itself:
tests/unit/callbacks/test_lightning_checkpoint_files.py."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.lightning.callbacks import ModelCheckpoint
from trainer.lightning.pytorch import LightningModule, Trainer

pytestmark = pytest.mark.timeout(600)

VAL_LOSSES = [0.5, 0.2, 0.4, 0.1]
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class Regression(LightningModule):
    def __init__(self, batch_size: int = 8):
        super().__init__()
        self.batch_size = batch_size
        self.layer = torch.nn.Linear(4, 1)
        with torch.no_grad():  # the same initial weights in every instance
            self.layer.weight.copy_(torch.linspace(-0.5, 0.5, 4).view(1, 4))
            self.layer.bias.fill_(0.1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.tensor(VAL_LOSSES[self.current_epoch]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)),
                          batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)


def fit(root, module, callbacks, max_epochs, ckpt_path=None, **flags):
    trainer = Trainer(max_epochs=max_epochs, callbacks=callbacks, default_root_dir=str(root), **QUIET, **flags)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer


def test_ddp_writes_one_process_files_and_resumes_from_a_ckpt_file(tmp_path):
    settings = dict(monitor="val_loss", save_top_k=2, save_last=True)
    one = Regression(batch_size=8)
    fit(tmp_path / "r1", one, [ModelCheckpoint(dirpath=str(tmp_path / "one"), **settings)], max_epochs=4)
    ddp = dict(strategy="ddp", devices=2, accelerator="cpu")
    first = ModelCheckpoint(dirpath=str(tmp_path / "two"), **settings)
    fit(tmp_path / "r2", Regression(batch_size=4), [first], max_epochs=2, **ddp)
    # the caller's callback has rank 0's results
    assert first.last_model_path == str(tmp_path / "two" / "last.ckpt")
    assert first.best_model_path == str(tmp_path / "two" / "epoch=1-step=4.ckpt")
    assert float(first.best_model_score) == pytest.approx(0.2)
    resumed = Regression(batch_size=4)
    fit(tmp_path / "r3", resumed, [ModelCheckpoint(dirpath=str(tmp_path / "two"), **settings)], max_epochs=4,
        ckpt_path=str(tmp_path / "two" / "last.ckpt"), **ddp)
    assert sorted(os.listdir(tmp_path / "two")) == sorted(os.listdir(tmp_path / "one")) == [
        "epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt", "last.ckpt"]
    torch.testing.assert_close(resumed.layer.weight, one.layer.weight, rtol=1e-6, atol=1e-7)
    saved = torch.load(tmp_path / "two" / "last.ckpt", weights_only=True)
    torch.testing.assert_close(saved["state_dict"]["layer.weight"], one.layer.weight.detach(), rtol=1e-6, atol=1e-7)
    assert saved["global_step"] == 8


def test_fsdp_writes_consolidated_files_that_load_as_one_process_weights(tmp_path):
    one = Regression(batch_size=8)
    fit(tmp_path / "r1", one, [], max_epochs=2)
    callback = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val_loss", save_top_k=1)
    fit(tmp_path / "run", Regression(batch_size=4), [callback], max_epochs=2, strategy="fsdp", devices=2,
        accelerator="cpu")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch=1-step=4.ckpt"]
    loaded = Regression.load_from_checkpoint(str(tmp_path / "ckpt" / "epoch=1-step=4.ckpt"))
    torch.testing.assert_close(loaded.layer.weight, one.layer.weight, rtol=1e-6, atol=1e-7)
