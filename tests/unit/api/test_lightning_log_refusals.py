"""``self.log`` calls Lightning refuses, refused here with Lightning's exception
(``MisconfigurationException``) and words a program's ``match=`` finds, each checked against Lightning
itself where it is installed; and ``Trainer(barebones=True)``, under which ``self.log`` warns and logs
nothing (as Lightning)."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L

torchmetrics = pytest.importorskip("torchmetrics")


def _accuracy():
    return torchmetrics.Accuracy(task="multiclass", num_classes=2)


class Steps:
    """(A LightningModule's hooks, for Lightning's class and ours.) ``case`` picks the wrong call."""

    def __init__(self, case):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.case = case
        if case == "metric not an attribute, another is":
            self.bar = _accuracy()

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        if self.case == "dataloader_idx in the name":
            self.log("foo/dataloader_idx_0", -1.0)
        elif self.case.startswith("metric not an attribute"):
            self.log("foo", _accuracy())
        elif self.case == "twice in one hook":
            self.log("foo", -1.0, prog_bar=False)
            self.log("foo", -1.0, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2)


CASES = {
    "dataloader_idx in the name": "`self.log` with the key `foo/dataloader_idx_0`",
    "metric not an attribute": "fix this by setting an attribute for the metric in your",
    "metric not an attribute, another is": r"`self.log\(foo, ..., metric_attribute=name\)` where `name` is one of \['bar'\]",
    "twice in one hook": r"self.log\(foo, ...\)` twice in `training_step`",
}


def _flags(tmp_path):
    return dict(default_root_dir=str(tmp_path), max_epochs=1, limit_train_batches=1, limit_val_batches=0,
                enable_progress_bar=False, enable_checkpointing=False, logger=False, enable_model_summary=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_as_lightning_refuses(tmp_path, case):
    from trainer.lightning.utilities.exceptions import MisconfigurationException

    ours = type("Ours", (Steps, L.LightningModule), {})
    with pytest.raises(MisconfigurationException, match=CASES[case]):
        L.Trainer(**_flags(tmp_path / "ours")).fit(ours(case))
    pl = pytest.importorskip("lightning.pytorch")
    theirs = type("Theirs", (Steps, pl.LightningModule), {})
    lightning_error = importlib.import_module("lightning.pytorch.utilities.exceptions").MisconfigurationException
    with pytest.raises(lightning_error, match=CASES[case]):
        pl.Trainer(**_flags(tmp_path / "lightning")).fit(theirs(case))


def test_a_metric_attribute_is_found_where_it_is_nested(tmp_path):
    class Nested(Steps, L.LightningModule):
        def __init__(self):
            super().__init__("none")
            self.metrics = torch.nn.ModuleDict({"acc": _accuracy()})

        def training_step(self, batch, batch_idx):
            self.metrics["acc"](torch.tensor([0, 1]), torch.tensor([0, 1]))
            self.log("acc", self.metrics["acc"])
            return super().training_step(batch, batch_idx)

    trainer = L.Trainer(**_flags(tmp_path))
    trainer.fit(Nested())
    assert float(trainer.callback_metrics["acc"]) == 1.0


def test_barebones_warns_and_logs_nothing(tmp_path):
    class Logs(Steps, L.LightningModule):
        def training_step(self, batch, batch_idx):
            self.log("seen", 1.0)
            self.log_dict({"also": 2.0})
            return super().training_step(batch, batch_idx)

    trainer = L.Trainer(barebones=True, default_root_dir=str(tmp_path), max_epochs=1, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"barebones=True\)` is configured"):
        trainer.fit(Logs("none"))
    assert "seen" not in trainer.callback_metrics and "also" not in trainer.callback_metrics


@pytest.mark.parametrize(("value", "options", "error", "match"), [
    (-1.0, dict(reduce_fx=torch.argmax), "MisconfigurationException", r"reduce_fx={min,max,mean,sum}\)` are supported"),
    (torch.tensor([1.0, 2.0]), {}, "ValueError", "tensor must have a single element"),
])
def test_a_reduction_or_a_value_lightning_refuses(tmp_path, value, options, error, match):
    from trainer.lightning.utilities import exceptions

    class Logs(Steps, L.LightningModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", value, **options)
            return super().training_step(batch, batch_idx)

    with pytest.raises(getattr(exceptions, error, ValueError), match=match):
        L.Trainer(**_flags(tmp_path)).fit(Logs("none"))
