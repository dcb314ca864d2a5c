"""Lightning's run-length flags honoured in global batches, with Lightning itself as the oracle for
the counts: ``limit_test_batches`` / ``limit_predict_batches`` (int, float, 0), ``limit_val_batches=0``,
``limit_train_batches=0``, ``min_epochs`` / ``min_steps``, ``overfit_batches``; also Lightning's CPU
strategy names and ``detect_anomaly``. One 2-process check: a predict limit gives the same batches
on 1 and 2 ranks."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.support.helpers import new_trainer
from trainer import Trainer
from trainer.strategies.ddp import DDPStrategy

pytest.importorskip("lightning")


def counting_module(pl):
    """A tiny module of package ``pl`` (Lightning's, or trainer.lightning) counting its steps and hooks
    and recording the first feature of each training batch."""

    class Counting(pl.LightningModule):
        def __init__(self, stop_at_step=None, train_shuffle=True):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.counts, self.seen = {}, []
            self.stop_at_step, self.train_shuffle = stop_at_step, train_shuffle

        def _count(self, name):
            self.counts[name] = self.counts.get(name, 0) + 1

        def training_step(self, batch, batch_idx):
            self._count("train")
            self.seen.append(batch[0][:, 0].tolist())
            if self.stop_at_step is not None and self.global_step >= self.stop_at_step:
                self.trainer.should_stop = True
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            self._count("val")
            self.log("v", batch[0].sum())

        def test_step(self, batch, batch_idx):
            self._count("test")
            self.log("t", batch[0].sum())

        def predict_step(self, batch, batch_idx):
            self._count("predict")
            return batch[0]

        def on_fit_start(self):
            self._count("on_fit_start")

        def on_train_start(self):
            self._count("on_train_start")

        def on_fit_end(self):
            self._count("on_fit_end")

        def on_test_start(self):
            self._count("on_test_start")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):  # 16 samples, 4 batches of 4
            return DataLoader(TensorDataset(torch.arange(32.0).view(16, 2)), batch_size=4, shuffle=self.train_shuffle)

        def _eval_loader(self):  # 10 samples, 5 batches of 2
            return DataLoader(TensorDataset(torch.arange(20.0).view(10, 2)), batch_size=2)

        val_dataloader = test_dataloader = predict_dataloader = _eval_loader

    return Counting


def run(side, tmp_path, call, module_args=None, **flags):
    """``call`` ("fit", "test", "predict") under Lightning or ours; (module, trainer, result)."""
    if side == "lightning":
        import lightning.pytorch as pl

        trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=str(tmp_path / "pl"), log_every_n_steps=1,
                             **flags)
    else:
        import trainer.lightning as pl

        trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             default_root_dir=str(tmp_path / "ours"), log_every_n_steps=1, **flags)
    module = counting_module(pl)(**(module_args or {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = getattr(trainer, call)(module)
    return module, trainer, result


def both(tmp_path, call, module_args=None, **flags):
    return (run("lightning", tmp_path, call, module_args, **flags), run("ours", tmp_path, call, module_args, **flags))


@pytest.mark.parametrize("limit", [2, 0.5, 0.25, 0])
def test_limit_test_batches_runs_lightnings_batches(tmp_path, limit):
    (pl_module, _, pl_result), (module, _, result) = both(tmp_path, "test", limit_test_batches=limit)
    assert module.counts == pl_module.counts
    if limit == 0:  # no pass, no metric: an empty list, as Lightning's
        assert pl_result == [] and result == []
    else:  # the mean of the first batches' sums: the same samples
        assert result[0]["t"] == pytest.approx(pl_result[0]["t"])


@pytest.mark.parametrize("limit", [3, 0.5, 0])
def test_limit_predict_batches_returns_lightnings_batches(tmp_path, limit):
    (pl_module, _, pl_result), (module, _, result) = both(tmp_path, "predict", limit_predict_batches=limit)
    assert module.counts == pl_module.counts
    if limit == 0:
        assert result is None and pl_result is None
    else:
        torch.testing.assert_close(torch.cat(result), torch.cat(pl_result))


@pytest.mark.parametrize("limit", [0, 0.0])
def test_limit_val_batches_zero_validates_nothing(tmp_path, limit):
    (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, "fit", max_epochs=1, limit_val_batches=limit)
    assert module.counts == pl_module.counts and "val" not in module.counts
    assert trainer.global_step == pl_trainer.global_step == 4


def test_limit_train_batches_zero_trains_nothing(tmp_path):
    (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, "fit", max_epochs=2, limit_train_batches=0)
    assert module.counts == pl_module.counts == {"on_fit_start": 1, "val": 2, "on_fit_end": 1}  # the sanity pass
    assert trainer.global_step == pl_trainer.global_step == 0


@pytest.mark.parametrize("flags", [dict(min_epochs=3, max_epochs=5), dict(min_steps=6, max_epochs=5)])
def test_a_stop_waits_for_min_epochs_and_min_steps(tmp_path, flags, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, "fit", {"stop_at_step": 0}, **flags)
    assert module.counts["train"] == pl_module.counts["train"] and trainer.global_step == pl_trainer.global_step
    assert trainer.global_step == (12 if "min_epochs" in flags else 6)
    assert "training continues" in caplog.text


def test_min_epochs_alone_sets_the_epochs_when_max_epochs_is_unset(tmp_path):
    trainer = new_trainer(tmp_path, max_steps=-1, min_epochs=3)
    assert trainer.max_epochs == 3
    assert new_trainer(tmp_path, max_steps=-1, min_epochs=3, max_epochs=2).max_epochs == 2


@pytest.mark.parametrize("overfit", [2, 0.5])
def test_overfit_batches_trains_on_the_first_batches_in_order(tmp_path, overfit):
    (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, "fit", max_epochs=2, overfit_batches=overfit)
    assert module.seen == pl_module.seen  # the first batches, unshuffled, every epoch
    assert module.seen[0] == [0.0, 2.0, 4.0, 6.0]
    assert module.counts["train"] == pl_module.counts["train"] and trainer.global_step == pl_trainer.global_step
    if isinstance(overfit, int):  # (a float limits validation to that fraction of its samples, not of its batches)
        assert module.counts == pl_module.counts


def test_overfit_batches_wins_over_the_limits(tmp_path):
    trainer = new_trainer(tmp_path, overfit_batches=3, limit_train_batches=10, limit_val_batches=0.5)
    assert trainer.limit_train_batches == trainer.limit_val_batches == 3


@pytest.mark.parametrize("name, setting", [("limit_test_batches", -1), ("limit_predict_batches", 1.5),
                                           ("overfit_batches", -2), ("min_epochs", -1), ("min_steps", "3"),
                                           ("detect_anomaly", "yes")])
def test_wrong_values_are_one_line_errors(tmp_path, name, setting):
    with pytest.raises(ValueError, match=f"trainer.{name}"):
        new_trainer(tmp_path, **{name: setting})


@pytest.mark.parametrize("name, find_unused", [("ddp_spawn", False), ("ddp_fork", False), ("ddp_notebook", False),
                                               ("ddp_find_unused_parameters_true", True),
                                               ("ddp_spawn_find_unused_parameters_false", False)])
def test_lightnings_cpu_strategy_names_are_ddp(tmp_path, name, find_unused):
    trainer = new_trainer(tmp_path, strategy=name, devices=2, accelerator="cpu")
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy.find_unused_parameters is find_unused
    assert new_trainer(tmp_path, strategy="single_device").strategy.name == "single"


class AnomalySeen(counting_module(__import__("trainer.lightning", fromlist=["LightningModule"]))):
    def training_step(self, batch, batch_idx):
        self.counts["anomaly"] = torch.is_anomaly_enabled()
        return super().training_step(batch, batch_idx)


def test_detect_anomaly_is_on_during_the_call_and_restored(tmp_path):
    module = AnomalySeen()
    Trainer(detect_anomaly=True, max_steps=1, loggers=[], progress_bar=False, run_dir=str(tmp_path),
            num_sanity_val_steps=0, enable_checkpointing=False).fit(module)
    assert module.counts["anomaly"] is True and not torch.is_anomaly_enabled()


def test_a_predict_limit_gives_the_same_batches_on_one_and_two_ranks(tmp_path):
    data = DataLoader(TensorDataset(torch.arange(40.0).view(20, 2)), batch_size=2)
    one = new_trainer(tmp_path / "one", limit_predict_batches=3).predict(AnomalySeen(), data)
    two = new_trainer(tmp_path / "two", limit_predict_batches=3, strategy="ddp_spawn", devices=2,
                      accelerator="cpu").predict(AnomalySeen(), data)
    assert len(one) == len(two) == 3
    torch.testing.assert_close(torch.cat(two), torch.cat(one))
    torch.testing.assert_close(torch.cat(one), torch.arange(12.0).view(6, 2))
