"""Lightning's progress bar under the mirror: ``trainer.progress_bar_callback`` (the default
``TQDMProgressBar``, one given in ``callbacks``, None without a bar), the counts a bar reads
(``total_train_batches``, ``total_val_batches``), ``trainer.progress_bar_metrics`` and
``get_metrics``, each checked against Lightning itself where it is installed."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L
from trainer.lightning.callbacks import TQDMProgressBar
from trainer.lightning.callbacks.progress import ProgressBar
from trainer.lightning.utilities.exceptions import MisconfigurationException


class BarSteps:
    """(A LightningModule's hooks, for Lightning's class and ours.) Logs with every prog_bar / on_step /
    on_epoch choice, notes what the bar reads at each epoch end."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)
        self.totals = []

    def _loss(self, batch):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("loss_bar", loss, prog_bar=True)  # on_step only
        self.log("both_bar", loss, prog_bar=True, on_step=True, on_epoch=True)  # both_bar_step / _epoch
        self.log("epoch_bar", loss, prog_bar=True, on_step=False, on_epoch=True)
        self.log("hidden", loss)  # not on the bar
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_bar", self._loss(batch), prog_bar=True)
        if self.trainer.sanity_checking:
            self.log("sanity_bar", 1.0, prog_bar=True)

    def on_train_epoch_end(self):
        bar = self.trainer.progress_bar_callback
        self.totals.append((bar.total_train_batches, bar.total_val_batches))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(1)
        return DataLoader(TensorDataset(torch.randn(12, 3, generator=generator), torch.randn(12, 1, generator=generator)),
                          batch_size=4)

    def val_dataloader(self):
        generator = torch.Generator().manual_seed(2)
        return DataLoader(TensorDataset(torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)),
                          batch_size=2)


class Bar(BarSteps, L.LightningModule):
    pass


def _fit(trainer_class, module, tmp_path, **flags):
    trainer = trainer_class(default_root_dir=str(tmp_path), max_epochs=4, check_val_every_n_epoch=2,
                            limit_val_batches=3, num_sanity_val_steps=2, enable_checkpointing=False,
                            enable_model_summary=False, **flags)
    trainer.fit(module)
    return trainer


def test_the_default_bar_is_a_tqdm_bar_and_none_without_one():
    trainer = L.Trainer()
    assert isinstance(trainer.progress_bar_callback, TQDMProgressBar)
    assert trainer.progress_bar_callback.trainer is trainer
    assert trainer.progress_bar_callback not in trainer.callbacks  # (as the default checkpointing's)
    assert L.Trainer(enable_progress_bar=False).progress_bar_callback is None
    assert L.Trainer(barebones=True).progress_bar_callback is None
    mine = TQDMProgressBar()
    assert L.Trainer(callbacks=[mine]).progress_bar_callback is mine
    with pytest.raises(MisconfigurationException, match="enable_progress_bar=False"):
        L.Trainer(enable_progress_bar=False, callbacks=[TQDMProgressBar()])
    with pytest.raises(MisconfigurationException, match="2 progress bars"):
        L.Trainer(callbacks=[TQDMProgressBar(), TQDMProgressBar()])
    with pytest.raises(TypeError, match="no Trainer"):
        TQDMProgressBar().trainer


def test_the_trainers_own_bar_is_drawn_only_for_an_enabled_tqdm_bar():
    assert L.Trainer(enable_progress_bar=True).progress_bar is True
    assert L.Trainer().progress_bar is None  # (drawn when stderr is a terminal)
    assert L.Trainer(enable_progress_bar=False).progress_bar is False
    assert L.Trainer(callbacks=[TQDMProgressBar(refresh_rate=0)], enable_progress_bar=True).progress_bar is False

    class Custom(ProgressBar):
        def disable(self):
            pass

    custom = Custom()
    trainer = L.Trainer(callbacks=[custom], enable_progress_bar=True)
    assert trainer.progress_bar_callback is custom and trainer.progress_bar is False  # it draws itself
    bar = TQDMProgressBar()
    trainer = L.Trainer(callbacks=[bar], enable_progress_bar=True)
    bar.disable()
    assert trainer.progress_bar is False and bar.is_disabled
    bar.enable()
    assert trainer.progress_bar is True


def test_progress_bar_metrics_and_counts_are_lightnings(tmp_path):
    module = Bar()
    trainer = _fit(L.Trainer, module, tmp_path / "ours", logger=False)
    # train batches per epoch; validation batches only in the epochs that validate (every 2nd)
    assert module.totals == [(3, 0), (3, 3), (3, 0), (3, 3)]
    metrics = trainer.progress_bar_metrics
    assert set(metrics) == {"loss_bar", "both_bar_step", "both_bar_epoch", "epoch_bar", "val_bar"}
    assert all(isinstance(value, float) for value in metrics.values())
    for name, value in metrics.items():
        assert value == pytest.approx(float(trainer.callback_metrics[name]), rel=1e-6)
    assert trainer.progress_bar_callback.get_metrics(trainer, module) == metrics  # no logger: no v_num

    pl = pytest.importorskip("lightning.pytorch")
    expected_module = type("PlBar", (BarSteps, pl.LightningModule), {})()
    expected = _fit(pl.Trainer, expected_module, tmp_path / "lightning", logger=False)
    assert module.totals == expected_module.totals
    assert set(metrics) == set(expected.progress_bar_metrics)
    for name, value in expected.progress_bar_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5), name


def test_get_metrics_shows_the_loggers_version(tmp_path):
    from trainer.lightning.loggers import CSVLogger

    module = Bar()
    trainer = _fit(L.Trainer, module, tmp_path, logger=CSVLogger(str(tmp_path), version=7), max_steps=1)
    shown = trainer.progress_bar_callback.get_metrics(trainer, module)
    assert shown["v_num"] == 7 and "loss_bar" in shown
    trainer = L.Trainer(default_root_dir=str(tmp_path), logger=CSVLogger(str(tmp_path), version="run_12345"))
    assert trainer.progress_bar_callback.get_metrics(trainer, module)["v_num"] == "2345"  # (a string's last 4)


def test_the_sanity_checks_values_are_not_on_the_bar(tmp_path):
    seen = {}

    class Probe(Bar):
        def training_step(self, batch, batch_idx):
            if batch_idx == 0 and self.current_epoch == 0:
                seen["first step"] = dict(self.trainer.progress_bar_metrics)
            return super().training_step(batch, batch_idx)

    trainer = _fit(L.Trainer, Probe(), tmp_path, logger=False, max_steps=1)
    assert seen["first step"] == {}
    assert "sanity_bar" not in trainer.progress_bar_metrics


def test_state_holds_lightnings_enums(tmp_path):
    from trainer.lightning.trainer.states import RunningStage, TrainerFn, TrainerStatus

    seen = []

    class Probe(Bar):
        def training_step(self, batch, batch_idx):
            seen.append((self.trainer.state.fn, self.trainer.state.stage))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen.append((self.trainer.state.fn, self.trainer.state.stage))

    trainer = L.Trainer(default_root_dir=str(tmp_path), max_steps=1, logger=False, enable_checkpointing=False,
                        limit_val_batches=1, num_sanity_val_steps=1, enable_progress_bar=False)
    assert trainer.state.status is TrainerStatus.INITIALIZING and trainer.state.fn is None
    trainer.fit(Probe())
    assert seen[0] == (TrainerFn.FITTING, RunningStage.SANITY_CHECKING)
    assert seen[1] == (TrainerFn.FITTING, RunningStage.TRAINING) and seen[1][0].value == "fit"
    assert seen[1] == ("fit", "train")  # (equal to the core Trainer's strings)
    assert trainer.state.status is TrainerStatus.FINISHED and trainer.state.finished
    trainer.validate(Probe())
    assert seen[-1] == (TrainerFn.VALIDATING, RunningStage.VALIDATING) and seen[-1][1].value == "validate"
