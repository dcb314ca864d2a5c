"""Lightning's module and trainer attributes that ported programs read: ``self.print`` (rank 0 only),
``self.dtype``, ``self.on_gpu``, ``trainer.num_devices``, ``trainer.default_root_dir``; and Lightning's
Trainer defaults do not warn about settings the user never gave."""

from __future__ import annotations

import logging

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L


class Reads(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen = {}

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def on_train_start(self):
        self.seen = {"dtype": self.dtype, "on_gpu": self.on_gpu, "num_devices": self.trainer.num_devices,
                     "root": self.trainer.default_root_dir}
        self.print("printed on rank 0")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def test_lightning_attributes_and_no_warning_for_unasked_defaults(tmp_path, capsys, caplog):
    module = Reads()
    with caplog.at_level(logging.WARNING):
        L.Trainer(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                  default_root_dir=str(tmp_path)).fit(module)
    assert module.seen == {"dtype": torch.float32, "on_gpu": False, "num_devices": 1, "root": str(tmp_path)}
    assert "printed on rank 0" in capsys.readouterr().out
    # check_val_every_n_epoch=1 is Lightning's default, not the user's setting: no "nothing is validated" warning
    assert "nothing is validated" not in caplog.text
    module.double()
    assert module.dtype == torch.float64


HOOKS = ("on_fit_start", "on_sanity_check_start", "on_validation_start", "on_train_epoch_start", "on_train_batch_start",
         "on_validation_end", "on_train_end", "on_test_start", "on_predict_start")


def _state_recorder(base):
    """A callback class (on ``base``) recording Lightning's state flags at each hook of HOOKS."""
    def record(hook):
        def method(self, trainer, module, *args, **kwargs):
            state = trainer.state
            counts = (trainer.num_training_batches if hook == "on_train_epoch_start" else None,
                      list(trainer.num_val_batches) if hook in ("on_validation_start", "on_validation_end") else None)
            self.seen.append((hook, counts, str(state.fn.value if hasattr(state.fn, "value") else state.fn),
                              str(state.stage.value if hasattr(state.stage, "value") else state.stage),
                              trainer.training, trainer.validating, trainer.testing, trainer.predicting,
                              trainer.sanity_checking))
        return method
    return type("StateRecorder", (base,), {"seen": None, **{hook: record(hook) for hook in HOOKS}})


def full_module(base):
    """A module with every step, on ``base`` (Lightning's LightningModule or ours)."""

    class Full(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("v", self.layer(batch[0]).mean())

        def test_step(self, batch, batch_idx):
            self.log("t", self.layer(batch[0]).mean())

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    return Full()


def test_trainer_state_flags_and_batch_counts_as_lightnings(tmp_path):
    import lightning.pytorch as pl

    runs = []
    for api, root in ((pl, "lightning"), (L, "ours")):
        recorder = _state_recorder(api.Callback)()
        recorder.seen = []
        module = full_module(api.LightningModule)
        trainer = api.Trainer(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                              enable_model_summary=False, default_root_dir=str(tmp_path / root), callbacks=[recorder],
                              **({"accelerator": "cpu"} if api is pl else {}))
        for call in ("fit", "validate", "test", "predict"):
            getattr(trainer, call)(module)
        runs.append(recorder.seen)
    assert runs[1] == runs[0]
