"""The loggers of the mirror's Trainer as Lightning's: the default list (a TensorBoard logger at
``default_root_dir/lightning_logs/version_N``), ``trainer.log_dir``, the trainer's own ``metrics.jsonl``
beside the loggers' files but not among ``trainer.loggers``, nothing written with ``logger=False``,
``PL_TRAINER_*`` variables, ``lightning_module``, and ``TensorBoardLogger(log_graph=True)``."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L
from trainer.lightning.loggers import CSVLogger, TensorBoardLogger
from trainer.loggers import JSONLLogger
from trainer.loggers.tensorboard_graph import log_graphs

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             num_sanity_val_steps=0, log_every_n_steps=1)


class Regression(L.LightningModule):
    """A linear layer on 8 fixed samples, batches of 4; records what its hooks see."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.example_input_array = torch.zeros(3, 2)
        self.seen: dict = {}

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("loss", loss)
        self.seen = {"loggers": list(self.loggers), "module": self.trainer.lightning_module,
                     "log_dir": self.trainer.log_dir}
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        x = torch.arange(16, dtype=torch.float32).reshape(8, 2) / 10
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def test_default_logger_is_lightnings_and_metrics_jsonl_is_beside_it_not_among_the_loggers(tmp_path):
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=2, **QUIET)
    expected = str(tmp_path / "lightning_logs" / "version_0")
    assert [type(logger) for logger in trainer.loggers] == [TensorBoardLogger]
    assert trainer.log_dir == trainer.logger.log_dir == expected
    module = Regression()
    trainer.fit(module)
    assert module.seen["loggers"] == trainer.loggers and module.seen["module"] is module
    assert module.seen["log_dir"] == expected == trainer.log_dir
    assert not any(isinstance(logger, JSONLLogger) for logger in trainer.loggers)
    with open(os.path.join(expected, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2]
    files = os.listdir(expected)
    assert "hparams.yaml" in files and any(name.startswith("events.out.tfevents.") for name in files)
    assert L.Trainer(default_root_dir=tmp_path, max_steps=1).log_dir == str(tmp_path / "lightning_logs" / "version_1")


def test_log_dir_follows_the_first_logger_and_without_loggers_is_default_root_dir(tmp_path):
    csv = CSVLogger(tmp_path / "csv", name="exp")
    trainer = L.Trainer(default_root_dir=tmp_path, logger=[csv, TensorBoardLogger(tmp_path / "tb")])
    assert trainer.log_dir == str(tmp_path / "csv" / "exp" / "version_0")
    assert L.Trainer(default_root_dir=tmp_path, logger=False).log_dir == str(tmp_path)
    trainer.loggers = None
    assert trainer.loggers == [] and trainer.logger is None and trainer.log_dir == str(tmp_path)


def test_logger_false_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = L.Trainer(logger=False, max_steps=2, **QUIET)
    assert trainer.default_root_dir == os.getcwd()
    trainer.fit(Regression())
    assert trainer.global_step == 2
    assert os.listdir(tmp_path) == []


def test_pl_trainer_variables_give_the_arguments_not_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    trainer = L.Trainer(default_root_dir=tmp_path)
    assert trainer.max_steps == 7 and trainer.logger is None
    assert L.Trainer(default_root_dir=tmp_path, max_steps=3, logger=True).max_steps == 3
    monkeypatch.setenv("PL_TRAINER_NOT_AN_ARGUMENT", "1")
    with pytest.warns(UserWarning, match="PL_TRAINER_NOT_AN_ARGUMENT='1' is not a Trainer argument"):
        L.Trainer(default_root_dir=tmp_path)


def test_estimated_stepping_batches_is_max_steps_when_it_alone_bounds_the_run(tmp_path):
    assert L.Trainer(default_root_dir=tmp_path, max_steps=5, logger=False).estimated_stepping_batches == 5
    with pytest.raises(RuntimeError, match="known once fit has read the data"):
        _ = L.Trainer(default_root_dir=tmp_path, max_epochs=2, logger=False).estimated_stepping_batches


def test_log_graph_writes_the_traced_graph_into_the_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, log_graph=True)
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=1, logger=logger, **QUIET)
    module = Regression()
    trainer.fit(module)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert "layer" in str(events.Graph())
    assert module.training  # the tracer's eval mode was undone
    module.example_input_array = None
    with pytest.warns(UserWarning, match="`model.example_input_array` attribute is not set"):
        logger.log_graph(module)
    logger.finalize()


def test_log_graph_under_a_sharding_strategy_is_skipped_with_a_warning(tmp_path):
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="not logged under strategy='fsdp'"):
        log_graphs([logger], Regression(), "fsdp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log_graphs([TensorBoardLogger(tmp_path)], Regression(), "fsdp")  # no graph asked: no warning
    assert not os.path.exists(logger.log_dir)
