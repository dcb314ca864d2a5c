"""``fit`` / ``validate`` / ``test`` / ``predict`` with Lightning's arguments and positional order:
``fit(model, dm)``, ``model=`` (and ``module=``), DataLoaders given to the call used exactly as the
module's hooks returning them, ``verbose``, ``return_predictions``, and a DataModule reading
``self.trainer``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.support.helpers import Regressor, new_trainer, read_metrics, regression_data
from trainer import DataModule


def losses(trainer):
    return [r["train/loss"] for r in read_metrics(trainer.run_dir) if "train/loss" in r]


class Evaluated(Regressor):
    test_step = Regressor.validation_step

    def predict_step(self, batch, batch_idx):
        self.predicted = getattr(self, "predicted", 0) + 1
        return self(batch[0])


class PerRankBatch(DataModule):
    """A global batch of 16 divided by ``self.trainer.world_size`` (a common Lightning idiom)."""

    def setup(self, stage):
        self.per_rank = 16 // self.trainer.world_size
        self.data = regression_data(64)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.per_rank)

    def test_dataloader(self):
        return DataLoader(regression_data(20, seed=3), batch_size=self.per_rank)


def test_fit_model_datamodule_positional_and_the_datamodule_reads_its_trainer(tmp_path):
    detached = PerRankBatch()
    assert detached.trainer is None  # as Lightning: no trainer before a call
    one = new_trainer(tmp_path / "one", max_steps=4)
    one.fit(Evaluated(), detached)  # Lightning's fit(model, dm): the DataModule is the datamodule
    assert detached.trainer is one and one.datamodule is detached and one.batch_size == 16
    by_keyword = new_trainer(tmp_path / "kw", max_steps=4)
    by_keyword.fit(model=Evaluated(), datamodule=PerRankBatch())
    alias = new_trainer(tmp_path / "alias", max_steps=4)
    alias.fit(module=Evaluated(), datamodule=PerRankBatch())
    ddp = new_trainer(tmp_path / "ddp", max_steps=4, strategy="ddp", devices=2)
    ddp.fit(Evaluated(), PerRankBatch())
    # (each rank's setup divided by world_size 2: the same global batch of 16; with 32 the losses differ)
    assert losses(by_keyword) == losses(alias) == losses(one)
    torch.testing.assert_close(losses(ddp), losses(one), rtol=1e-5, atol=1e-6)
    assert ddp.test(dataloaders=PerRankBatch(), verbose=False)["test/loss"] == pytest.approx(
        one.test(datamodule=PerRankBatch(), verbose=False)["test/loss"], rel=1e-5)


class HookLoaders(Evaluated):
    """The same loaders as the test passes to the calls, from the module's own hooks."""

    def train_dataloader(self):
        return DataLoader(regression_data(64), batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(regression_data(20, seed=8), batch_size=5)

    test_dataloader = val_dataloader

    def predict_dataloader(self):
        return DataLoader(TensorDataset(regression_data(20, seed=8).tensors[0]), batch_size=5)


def test_loaders_given_to_the_calls_mean_what_the_hooks_mean(tmp_path, capsys):
    hooks = new_trainer(tmp_path / "hooks", max_steps=6, val_every_n_steps=3)
    hooks.fit(HookLoaders())
    given = new_trainer(tmp_path / "given", max_steps=6, val_every_n_steps=3)
    module = Evaluated()
    loaders = HookLoaders()
    given.fit(module, loaders.train_dataloader(), val_dataloaders=loaders.val_dataloader())
    assert given.batch_size == 8  # adopted from the loader, as from train_dataloader()
    assert losses(given) == losses(hooks)  # the same shuffled order: the trainer's seeded plan
    val = [[r["val/loss"] for r in read_metrics(t.run_dir) if "val/loss" in r] for t in (hooks, given)]
    assert len(val[0]) == 2 and val[0] == val[1]
    assert given.validate(module, loaders.val_dataloader(), verbose=False) == hooks.validate(verbose=False)
    capsys.readouterr()
    tested = given.test(module, loaders.test_dataloader())  # verbose=True: a table on rank 0
    assert tested == hooks.test(verbose=False)
    table = capsys.readouterr().out
    assert "test metric" in table and f"{tested['test/loss']:.6g}" in table
    got = given.predict(module, loaders.predict_dataloader())
    assert [t.shape[0] for t in got] == [5] * 4
    torch.testing.assert_close(torch.cat(got), torch.cat(hooks.predict()))
    # DDP 2 with the same loaders at half the per-rank batch: the same global batches as one process.
    ddp = new_trainer(tmp_path / "ddp", max_steps=6, val_every_n_steps=3, strategy="ddp", devices=2)
    ddp.fit(Evaluated(), DataLoader(regression_data(64), batch_size=4, shuffle=True), loaders.val_dataloader())
    torch.testing.assert_close(losses(ddp), losses(hooks), rtol=1e-5, atol=1e-6)
    ddp_val = [r["val/loss"] for r in read_metrics(ddp.run_dir) if "val/loss" in r]
    torch.testing.assert_close(ddp_val, val[0], rtol=1e-5, atol=1e-6)


def test_return_predictions_false_runs_predict_step_and_returns_nothing(tmp_path):
    module = Evaluated()
    loader = DataLoader(TensorDataset(torch.randn(12, 6)), batch_size=4)
    assert new_trainer(tmp_path).predict(module, loader, return_predictions=False) is None
    assert module.predicted == 3


def test_wrong_arguments_are_one_line_errors(tmp_path):
    trainer = new_trainer(tmp_path, max_steps=1)
    loader = DataLoader(regression_data(8), batch_size=4)
    with pytest.raises(TypeError, match=r"train_dataloaders='last' is a path; .* ckpt_path='last'"):
        trainer.fit(Evaluated(), "last")
    with pytest.raises(TypeError, match=r"datamodule='last' is a path; .* ckpt_path='last'"):
        trainer.predict(Evaluated(), PerRankBatch(), "last")  # the order predict(module, datamodule, ckpt_path) had
    with pytest.raises(TypeError, match=r"dataloaders=\[1\] must return a torch.utils.data.DataLoader, an iterable of "
                                        r"ready batches \(or None\), got str"):
        trainer.fit(Evaluated(), val_dataloaders=[loader, "x"])
    with pytest.raises(RuntimeError, match=r"multiple `val_dataloader` \(2 loaders\), but no `dataloader_idx` argument "
                                           r"in `Evaluated.validation_step\(\)`"):
        trainer.fit(Evaluated(), val_dataloaders=[loader, loader])
    with pytest.raises(ValueError, match=r"either as dataloaders= or as datamodule="):
        trainer.test(Evaluated(), loader, datamodule=PerRankBatch())
    with pytest.raises(TypeError, match=r"model= and module= name the same argument"):
        trainer.fit(model=Evaluated(), module=Evaluated())
    with pytest.raises(TypeError, match=r"ckpt_path= got a PerRankBatch; give it as datamodule="):
        trainer.fit(Evaluated(), ckpt_path=PerRankBatch())
    with pytest.raises(ValueError, match=r"return_predictions='no'"):
        trainer.predict(Evaluated(), loader, return_predictions="no")
