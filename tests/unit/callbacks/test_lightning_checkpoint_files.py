"""The mirror's ModelCheckpoint writes Lightning's checkpoint files: the same names and the same kept
files as Lightning's own ModelCheckpoint on the same program, ``save_on_exception``, a resume from a
``.ckpt`` file that trains as the uninterrupted run, and files that Lightning itself loads."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.lightning.callbacks import ModelCheckpoint
from trainer.lightning.pytorch import LightningModule, Trainer

pytestmark = pytest.mark.timeout(300)

#: val_loss by epoch: the lowest at epoch 3, the second lowest at epoch 1
VAL_LOSSES = [0.5, 0.2, 0.4, 0.1, 0.3, 0.6]


def make_module(base, fail_at_step=None):
    """The same tiny program on ``base`` (the mirror's LightningModule or Lightning's)."""

    class Scripted(base):
        def __init__(self, width: int = 4):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)
            with torch.no_grad():  # the same initial weights in every instance
                self.layer.weight.copy_(torch.linspace(-0.5, 0.5, width).view(1, width))
                self.layer.bias.fill_(0.1)

        def training_step(self, batch, batch_idx):
            if fail_at_step is not None and self.global_step == fail_at_step:
                raise RuntimeError("failing on purpose")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.tensor(VAL_LOSSES[self.current_epoch]))

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=0.05)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)]

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
            return DataLoader(data, batch_size=8)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=8)

    return Scripted


Module = make_module(LightningModule)
Module.__qualname__ = Module.__name__ = "Module"

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def ours(tmp_path, callbacks, max_epochs=5, module=None, ckpt_path=None):
    trainer = Trainer(max_epochs=max_epochs, callbacks=callbacks, default_root_dir=str(tmp_path / "root"), **QUIET)
    trainer.fit(module if module is not None else Module(), ckpt_path=ckpt_path)
    return trainer


def theirs(pl, callbacks, max_epochs=5, module=None):
    logging.getLogger("lightning").setLevel(logging.ERROR)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=max_epochs, callbacks=callbacks, **QUIET)
    trainer.fit(module if module is not None else make_module(pl.LightningModule)())
    return trainer


def files(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("settings", [
    dict(monitor="val_loss", save_top_k=2, filename="{epoch}-{val_loss:.2f}", save_last=True),
    dict(monitor="val_loss", mode="max", save_top_k=1),
    dict(save_top_k=-1, every_n_train_steps=3, filename="s{step}", auto_insert_metric_name=False),
    dict(monitor=None, save_top_k=1, save_last="link"),
])
def test_names_and_kept_files_are_lightnings(tmp_path, settings):
    pl = pytest.importorskip("lightning.pytorch")
    their_callback = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "theirs"), **settings)
    theirs(pl, [their_callback])
    mine = ModelCheckpoint(dirpath=str(tmp_path / "ours"), **settings)
    ours(tmp_path, [mine])
    assert files(tmp_path / "ours") == files(tmp_path / "theirs")
    assert os.path.basename(mine.best_model_path) == os.path.basename(their_callback.best_model_path)
    assert os.path.basename(mine.last_model_path) == os.path.basename(their_callback.last_model_path)
    assert {os.path.basename(p): float(v) for p, v in mine.best_k_models.items()} == {
        os.path.basename(p): float(v) for p, v in their_callback.best_k_models.items()}
    assert os.path.islink(tmp_path / "ours" / "last.ckpt") == os.path.islink(tmp_path / "theirs" / "last.ckpt")
    assert not [name for name in os.listdir(tmp_path / "ours") if name.startswith(".")]  # no staging left


def test_several_model_checkpoints_and_to_yaml(tmp_path):
    by_loss = ModelCheckpoint(dirpath=str(tmp_path / "a"), monitor="val_loss", save_top_k=2)
    every_epoch = ModelCheckpoint(dirpath=str(tmp_path / "b"), save_top_k=-1, filename="{epoch}")
    trainer = ours(tmp_path, [by_loss, every_epoch], max_epochs=4)
    assert trainer.checkpoint_callback is by_loss and trainer.checkpoint_callbacks == [by_loss, every_epoch]
    assert files(tmp_path / "a") == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]
    assert files(tmp_path / "b") == [f"epoch={e}.ckpt" for e in range(4)]
    by_loss.to_yaml()
    import yaml

    with open(tmp_path / "a" / "best_k_models.yaml") as handle:
        assert yaml.safe_load(handle) == {str(tmp_path / "a" / "epoch=1-step=4.ckpt"): pytest.approx(0.2),
                                          str(tmp_path / "a" / "epoch=3-step=8.ckpt"): pytest.approx(0.1)}


def test_save_on_exception_names_the_file_as_lightning(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    their_callback = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "theirs"), save_on_exception=True,
                                                  filename="{step}")
    with pytest.raises(RuntimeError, match="on purpose"):
        theirs(pl, [their_callback], module=make_module(pl.LightningModule, fail_at_step=5)())
    mine = ModelCheckpoint(dirpath=str(tmp_path / "ours"), save_on_exception=True, filename="{step}")
    with pytest.raises(Exception, match="on purpose"):
        ours(tmp_path, [mine], module=make_module(LightningModule, fail_at_step=5)())
    assert files(tmp_path / "ours") == files(tmp_path / "theirs") == ["step=4.ckpt", "step=5.ckpt"]
    saved = torch.load(tmp_path / "ours" / "step=5.ckpt", weights_only=True)
    assert saved["global_step"] == 5


def test_resume_from_a_ckpt_file_trains_as_the_uninterrupted_run(tmp_path):
    whole = ours(tmp_path / "whole", [ModelCheckpoint(dirpath=str(tmp_path / "w"))], max_epochs=4)
    first = ModelCheckpoint(dirpath=str(tmp_path / "half"), save_last=True)
    half = Module()
    ours(tmp_path / "a", [first], max_epochs=2, module=half)
    assert os.path.basename(first.last_model_path) == "last.ckpt"
    resumed = Module()
    trainer = ours(tmp_path / "b", [ModelCheckpoint(dirpath=str(tmp_path / "rest"))], max_epochs=4,
                   module=resumed, ckpt_path=first.last_model_path)
    assert trainer.global_step == whole.global_step == 8
    uninterrupted = Module.load_from_checkpoint(str(tmp_path / "w" / "epoch=3-step=8.ckpt"))
    for name, value in resumed.state_dict().items():  # Adam's moments and the scheduler restored too
        torch.testing.assert_close(value, uninterrupted.state_dict()[name], rtol=1e-6, atol=1e-7)
    assert not torch.equal(half.layer.weight, resumed.layer.weight)


def test_lightning_loads_the_files(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    callback = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val_loss")
    module = Module(width=4)
    ours(tmp_path, [callback], max_epochs=2, module=module)
    saved = torch.load(callback.best_model_path, map_location="cpu", weights_only=True)
    assert {"epoch", "global_step", "pytorch-lightning_version", "state_dict", "callbacks", "optimizer_states",
            "lr_schedulers", "hyper_parameters"} <= set(saved)
    assert saved["epoch"] == 1 and saved["global_step"] == 4 and saved["hyper_parameters"] == {"width": 4}
    assert saved["callbacks"][callback.state_key]["best_model_path"] == callback.best_model_path
    assert len(saved["optimizer_states"]) == 1 and "state" in saved["optimizer_states"][0]
    Theirs = make_module(pl.LightningModule)
    loaded = Theirs.load_from_checkpoint(callback.best_model_path)
    for name, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    mine = Module.load_from_checkpoint(callback.best_model_path)
    assert torch.equal(mine.layer.weight, module.layer.weight) and mine.hparams.width == 4


def test_save_weights_only_file_loads_but_does_not_resume(tmp_path):
    callback = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_weights_only=True)
    module = Module()
    ours(tmp_path, [callback], max_epochs=1, module=module)
    saved = torch.load(callback.best_model_path, weights_only=True)
    assert "optimizer_states" not in saved and "callbacks" not in saved
    assert torch.equal(Module.load_from_checkpoint(callback.best_model_path).layer.weight, module.layer.weight)
    with pytest.raises(Exception, match="weights only"):
        ours(tmp_path / "again", [], max_epochs=2, ckpt_path=callback.best_model_path)


def test_default_checkpointing_writes_lightnings_file(tmp_path):
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(Module())
    assert files(tmp_path / "checkpoints") == ["epoch=1-step=4.ckpt"]
    assert trainer.checkpoint_callback.best_model_path == str(tmp_path / "checkpoints" / "epoch=1-step=4.ckpt")
