"""Lightning's checkpointing arguments: ``ModelCheckpoint`` (compared with Lightning's own on which
checkpoints it keeps), ``enable_checkpointing``, Lightning's default checkpointing under the Python API
(one checkpoint per epoch end, the newest kept), and train.py's configs keeping their own default."""

from __future__ import annotations

import logging
import os
import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer
from trainer.api.module import TrainModule
from trainer.callbacks import Callback
from trainer.callbacks.model_checkpoint import ModelCheckpoint
from trainer.checkpoint import layout

pytestmark = pytest.mark.timeout(180)

#: val_loss by epoch: the lowest at epoch 3, the second lowest at epoch 1
VAL_LOSSES = [0.5, 0.2, 0.4, 0.1, 0.3]
TEST_DATA = (torch.randn(8, 4, generator=torch.Generator().manual_seed(2)), torch.randn(8, 1, generator=torch.Generator().manual_seed(3)))


def make_module(base):
    """The same tiny program on ``base`` (our TrainModule or Lightning's LightningModule)."""

    class Scripted(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.tensor(VAL_LOSSES[self.current_epoch]))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_mse", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def test_dataloader(self):
            return DataLoader(TensorDataset(*TEST_DATA), batch_size=8)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=8)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=8)

    return Scripted


Module = make_module(TrainModule)
Module.__qualname__ = Module.__name__ = "Module"  # picklable by reference, for spawned workers


class ParamsAtEpochEnd(Callback):
    """The weights at every epoch end, by global step."""

    def __init__(self):
        self.by_step = {}

    def on_train_epoch_end(self, trainer, module):
        self.by_step[trainer.global_step] = {k: v.clone() for k, v in module.state_dict().items()}


def ours(tmp_path, callbacks=(), max_epochs=5, **args):
    trainer = Trainer(max_epochs=max_epochs, callbacks=list(callbacks), run_dir=str(tmp_path), loggers=[],
                      progress_bar=False, enable_model_summary=False, check_val_every_n_epoch=1,
                      num_sanity_val_steps=0, **args)
    trainer.fit(Module())
    return trainer


def kept_steps(folder) -> list[int]:
    return sorted(int(name.split("-")[1]) for name in os.listdir(folder) if name.startswith("step-"))


def test_monitored_best_is_the_epoch_with_the_lowest_val_loss_and_loads(tmp_path):
    snapshots = ParamsAtEpochEnd()
    callback = ModelCheckpoint(monitor="val_loss", save_top_k=1)
    trainer = ours(tmp_path, [callback, snapshots])
    assert trainer.checkpoint_callback is callback
    best_step = 2 * (VAL_LOSSES.index(min(VAL_LOSSES)) + 1)  # 2 steps per epoch
    assert callback.best_model_path == os.path.join(str(tmp_path), "checkpoints", layout.checkpoint_name(best_step))
    assert float(callback.best_model_score) == pytest.approx(min(VAL_LOSSES))
    assert callback.last_model_path == ""  # save_last not set, as Lightning
    loaded = Module.load_from_checkpoint(callback.best_model_path)
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, snapshots.by_step[best_step][name]), name
    assert not torch.equal(loaded.layer.weight, snapshots.by_step[10]["layer.weight"])  # not the last epoch's
    # test(ckpt_path="best") evaluates the same checkpoint.
    tested = trainer.test(ckpt_path="best")
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(loaded.layer(TEST_DATA[0]), TEST_DATA[1]).item()
    assert tested["test_mse"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("save_top_k, save_last", [(2, True), (2, None), (1, None), (-1, None)])
def test_kept_checkpoints_are_lightnings_plus_the_newest(tmp_path, save_top_k, save_last):
    pl = pytest.importorskip("lightning.pytorch")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    theirs = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "lightning"), monitor="val_loss",
                                          save_top_k=save_top_k, save_last=save_last)
    pl.Trainer(accelerator="cpu", max_epochs=5, callbacks=[theirs], logger=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0).fit(make_module(pl.LightningModule)())
    their_steps = sorted(int(re.search(r"step=(\d+)", name).group(1))
                         for name in os.listdir(tmp_path / "lightning") if name != "last.ckpt")
    mine = ModelCheckpoint(dirpath=str(tmp_path / "ours"), monitor="val_loss", save_top_k=save_top_k, save_last=save_last)
    ours(tmp_path / "run", [mine])
    newest = 10
    # The same checkpoints, and the newest too (kept here for resuming: Lightning's last.ckpt when save_last).
    assert kept_steps(tmp_path / "ours") == sorted(set(their_steps) | {newest})
    assert os.path.basename(mine.best_model_path) == layout.checkpoint_name(
        int(re.search(r"step=(\d+)", theirs.best_model_path).group(1)))
    assert float(mine.best_model_score) == float(theirs.best_model_score)
    assert bool(mine.last_model_path) == bool(theirs.last_model_path)
    assert sorted(map(os.path.basename, mine.best_k_models)) == sorted(
        layout.checkpoint_name(int(re.search(r"step=(\d+)", path).group(1))) for path in theirs.best_k_models)


def test_default_checkpointing_saves_at_every_epoch_end_and_keeps_the_newest(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint.manager"):
        trainer = ours(tmp_path, max_epochs=3)
    saved = [int(m.group(1)) for m in re.finditer(r"checkpoint at step (\d+) written", caplog.text)]
    assert saved == [2, 4, 6]  # one per epoch end
    assert kept_steps(tmp_path / "checkpoints") == [6]
    assert trainer.checkpoint_callback.best_model_path == os.path.join(str(tmp_path), "checkpoints", layout.checkpoint_name(6))
    # Lightning's "best" without a monitor: the newest.
    from trainer.loop.resume import resolve_ckpt_path

    assert resolve_ckpt_path("best", None, trainer.checkpoint) == "last"


def test_enable_checkpointing_false_writes_none(tmp_path):
    trainer = ours(tmp_path, max_epochs=2, enable_checkpointing=False)
    assert trainer.checkpoint is None and trainer.checkpoint_callback is None
    assert not os.path.exists(tmp_path / "checkpoints")


def test_what_cannot_be_honoured_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"train_time_interval"):
        ModelCheckpoint(train_time_interval=5)
    with pytest.raises(ValueError, match=r"save_top_k=2, monitor=None"):
        ModelCheckpoint(save_top_k=2)
    with pytest.raises(ValueError, match=r"both set the checkpointing"):
        Trainer(checkpoint={"every_n_steps": 2}, callbacks=[ModelCheckpoint()])
    with pytest.raises(ValueError, match=r"enable_checkpointing=False\) with a ModelCheckpoint"):
        Trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()])
    with pytest.raises(ValueError, match=r"2 ModelCheckpoint callbacks"):
        Trainer(callbacks=[ModelCheckpoint(), ModelCheckpoint()])
    with pytest.raises(ValueError, match=r"disagree"):
        Trainer(checkpoint=None, enable_checkpointing=True)
    config = Trainer(callbacks=[ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)]).checkpoint
    assert (config.every_n_steps, config.every_n_epochs, config.keep_last) == (3, None, None)
    assert Trainer(callbacks=[ModelCheckpoint(save_top_k=0)]).checkpoint is None


def test_train_py_configs_keep_their_own_default(tmp_path):
    from tests.unit.loggers.test_logger_configs import compose
    from trainer.cli.hydra_app import build

    config = compose(["recipe=mlp"])
    trainer, _ = build(config, str(tmp_path))
    assert trainer.checkpoint.as_dict() == {**trainer.checkpoint.as_dict(), **config["checkpoint"]}  # conf/config.yaml's
    assert trainer.checkpoint_callback is None
    assert build(compose(["recipe=mlp", "checkpoint=null"]), str(tmp_path))[0].checkpoint is None  # never, as before
