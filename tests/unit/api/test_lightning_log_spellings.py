"""``self.log`` takes Lightning's spellings of a reduction (any case, "avg", the functions
``torch.mean`` / ``sum`` / ``max`` / ``min``, builtin or torch's) and means by them what the names
mean; a callback logs through ``self.log`` as Lightning's callbacks do."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.api.log_methods import reduction_name
from trainer.lightning import Callback, LightningModule, Trainer


@pytest.mark.parametrize("given, name", [("SUM", "sum"), ("avg", "mean"), ("Mean", "mean"), (torch.max, "max"),
                                         (max, "max"), (min, "min"), (torch.min, "min"), (sum, "sum"),
                                         (torch.sum, "sum"), (torch.mean, "mean"), ("median", "median")])
def test_lightnings_spellings_map_to_the_reductions(given, name):
    assert reduction_name(given) == name  # ("median" is left as given, for the collector to refuse)


class _Module(LightningModule):
    def __init__(self, reduce_fx):
        super().__init__()
        self.layer, self.reduce_fx = torch.nn.Linear(2, 1), reduce_fx

    def training_step(self, batch, batch_idx):
        self.log("idx", float(batch_idx), on_step=False, on_epoch=True, reduce_fx=self.reduce_fx)
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2)


class _Logs(Callback):
    def on_train_epoch_start(self, trainer, module):
        self.log("from_callback", 7.0)


@pytest.mark.parametrize("reduce_fx, expected", [(max, 3.0), ("SUM", 6.0), ("avg", 1.5), (torch.min, 0.0)])
def test_an_epoch_value_is_reduced_as_spelled_and_a_callback_logs(tmp_path, reduce_fx, expected):
    trainer = Trainer(default_root_dir=str(tmp_path), max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[_Logs()])
    trainer.fit(_Module(reduce_fx))
    assert float(trainer.callback_metrics["idx"]) == expected
    assert float(trainer.callback_metrics["from_callback"]) == 7.0


def test_a_callback_logging_outside_a_run_is_an_error():
    with pytest.raises(RuntimeError, match="outside a run"):
        _Logs().log("x", 1.0)
