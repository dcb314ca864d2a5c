"""Lightning's ``Trainer(barebones=True)``, its INFO lines about a limit of one batch (``1``) or of every
batch (``1.0``), ``module.trainer = trainer``, ``module.validation_step = None`` (no validation) and the
batch counts a finished ``fit`` leaves on the Trainer."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L


class Small(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.validated = 0

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.validated += 1
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def _quiet(tmp_path, **kwargs):
    return L.Trainer(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                     default_root_dir=str(tmp_path), **kwargs)


@pytest.mark.parametrize(("name", "value"), [("enable_checkpointing", True), ("logger", True),
                                             ("enable_progress_bar", True), ("enable_model_summary", True),
                                             ("num_sanity_val_steps", 1), ("fast_dev_run", 1),
                                             ("profiler", "simple"), ("log_every_n_steps", 1)])
def test_barebones_refuses_what_turns_an_extra_back_on(name, value):
    with pytest.raises(ValueError, match=rf"`Trainer\({name}={value!r}\)` was passed"):
        L.Trainer(barebones=True, **{name: value})


def test_barebones_runs_without_loggers_or_checkpoints(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer = L.Trainer(barebones=True, max_epochs=1, default_root_dir=str(tmp_path))
    assert "barebones=True" in caplog.text
    assert trainer.barebones and not trainer.loggers and not L.Trainer(logger=False).barebones
    module = Small()
    with pytest.warns(UserWarning, match=r"barebones=True\)` is configured"):  # self.log logs nothing (Lightning's)
        trainer.fit(module)
    assert not list(tmp_path.rglob("*.ckpt")) and not (tmp_path / "checkpoints").exists()
    assert "val_loss" not in trainer.callback_metrics and trainer.progress_bar_callback is None


@pytest.mark.parametrize("name", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                  "limit_predict_batches", "overfit_batches", "val_check_interval"])
def test_a_limit_of_one_says_which_one(name, caplog):
    for value, said in ((1, "configured so 1 batch" if name != "val_check_interval" else "validation will run after every training"),
                        (1.0, "configured so 100%" if name != "val_check_interval" else "validation will run at the end of each training")):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            L.Trainer(**{name: value})
        assert f"`Trainer({name}={value})` was configured" in caplog.text and said in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        L.Trainer(**{name: 2})
    assert "was configured" not in caplog.text


def test_module_trainer_can_be_set():
    module, trainer = Small(), L.Trainer()
    module.trainer = trainer
    assert module.trainer is trainer
    module.trainer = None
    with pytest.raises(RuntimeError, match="not attached"):
        module.trainer


def test_validation_step_none_turns_validation_off_and_counts_stay_after_fit(tmp_path):
    module = Small()
    trainer = _quiet(tmp_path, limit_val_batches=1)
    trainer.fit(module)
    assert module.validated == 1 + 2  # sanity check (2 batches), then 1 limited batch
    assert trainer.num_training_batches == 3 and trainer.num_val_batches == [1]

    module = Small()
    module.validation_step = None
    trainer = _quiet(tmp_path)
    trainer.fit(module)
    assert module.validated == 0 and trainer.num_val_batches == [] and trainer.num_training_batches == 3


def test_is_overridden_as_lightning():
    from unittest.mock import Mock

    from trainer.lightning.utilities.model_helpers import is_overridden

    module = Small()
    assert is_overridden("validation_step", module) and not is_overridden("test_step", module)
    module.validation_step = None
    assert not is_overridden("validation_step", module) and not is_overridden("training_step", None)
    module.test_step = Mock(wraps=L.LightningModule.test_step)
    assert not is_overridden("test_step", module)
    assert is_overridden("on_fit_start", type("Hooked", (L.Callback,), {"on_fit_start": lambda *a: None})())
    with pytest.raises(ValueError, match="parent="):
        is_overridden("forward", torch.nn.Linear(1, 1))


def test_node_rank_on_one_machine():
    assert L.Trainer().node_rank == 0


def test_module_ranks_are_its_trainers():
    from unittest.mock import Mock

    module = Small()
    assert (module.global_rank, module.local_rank) == (0, 0)
    module.trainer = Mock(global_rank=3, local_rank=1)
    assert (module.global_rank, module.local_rank) == (3, 1)


def test_csv_logger_log_hyperparams_without_params(tmp_path):
    from trainer.lightning.loggers import CSVLogger

    logger = CSVLogger(save_dir=str(tmp_path), name="")
    logger.log_hyperparams()
    assert (tmp_path / "version_0" / "hparams.yaml").exists()
