"""Lightning's logger objects: ``Trainer(logger=...)``, ``TensorBoardLogger`` / ``CSVLogger`` built with
Lightning's arguments (folders compared with Lightning's own loggers), ``self.logger.experiment`` from a
module (a GAN-like image grid read back from the event files), and the rank-zero DummyExperiment."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.unit.loggers.test_loggers import (  # noqa: F401 (no_network_wandb: an autouse fixture)
    no_network_wandb,
    offline_runs,
    wandb_run,
)
from trainer import Trainer
from trainer.api.module import TrainModule
from trainer.loggers import CSVLogger, DummyExperiment, JSONLLogger, TensorBoardLogger, WandbLogger
from trainer.loggers.base import DummyLogger

pytestmark = pytest.mark.timeout(120)


class ImageGridModule(TrainModule):
    """Like a GAN's generator: logs a loss with self.log and an image grid at every epoch end."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 12)
        self.seen_experiments: list = []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.log("g_loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self):
        grid = torch.sigmoid(self.layer(torch.ones(1, 4))).detach().reshape(3, 2, 2)
        experiment = self.logger.experiment
        self.seen_experiments.append(type(experiment).__name__)
        experiment.add_image("generated_images", grid, self.current_epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0))), batch_size=8)


class MetricsOnly(ImageGridModule):
    def on_train_epoch_end(self):
        self.seen_experiments.append(type(self.logger.experiment).__name__)  # a CSV writer has no add_image


def fit_with(logger, tmp_path, module_class=ImageGridModule, **args) -> tuple[Trainer, ImageGridModule]:
    trainer = Trainer(logger=logger, max_epochs=2, run_dir=str(tmp_path / "run"), progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, **args)
    module = module_class()
    trainer.fit(module)
    return trainer, module


def events(log_dir: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(log_dir, size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def test_logger_argument_takes_lightning_forms_and_refuses_both_names(tmp_path):
    tb, csv_logger = TensorBoardLogger(str(tmp_path)), CSVLogger(str(tmp_path))
    assert Trainer(logger=True).logger_specs == Trainer().logger_specs == [("tensorboard", {}), ("jsonl", {})]
    assert Trainer(logger=False).logger_specs == [] and Trainer(logger=False).logger is None
    assert Trainer(logger=tb).logger is tb and Trainer(logger=tb).loggers == [tb]
    assert Trainer(logger=[tb, csv_logger]).loggers == [tb, csv_logger]
    assert Trainer(loggers=["jsonl"]).logger_specs == [("jsonl", {})]  # our name keeps working
    with pytest.raises(TypeError, match=r"give one of them"):
        Trainer(logger=tb, loggers=["csv"])
    with pytest.raises(TypeError, match=r"names go to loggers="):
        Trainer(logger="csv")
    with pytest.raises(AttributeError, match=r"JSONLLogger has no experiment object \('add_image' asked for\)"):
        JSONLLogger(str(tmp_path)).experiment.add_image
    built = Trainer(run_dir=str(tmp_path / "r")).loggers  # before a run: the objects the run will use
    assert [type(logger) for logger in built] == [TensorBoardLogger, JSONLLogger]  # as Lightning: TensorBoard first
    assert built[0].log_dir == str(tmp_path / "r") and not os.path.exists(tmp_path / "r")  # nothing written yet


def test_folders_and_versions_are_lightnings(tmp_path):
    from lightning.pytorch.loggers import CSVLogger as LightningCSV, TensorBoardLogger as LightningTB

    for ours, theirs in ((TensorBoardLogger, LightningTB), (CSVLogger, LightningCSV)):
        for args in ({}, {"name": "exp"}, {"name": "", "version": 3}, {"name": "exp", "version": "mine"}):
            save_dir = str(tmp_path / ours.__name__)
            assert ours(save_dir, **args).log_dir == theirs(save_dir, **args).log_dir, args
        os.makedirs(os.path.join(save_dir, "lightning_logs", "version_4"))
        assert ours(save_dir).version == theirs(save_dir).version == 5
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['colour'\]"):
        TensorBoardLogger(str(tmp_path), colour=1)
    with pytest.raises(ValueError, match=r"log_model"):
        WandbLogger(save_dir=str(tmp_path), log_model=True)
    wandb = WandbLogger(name="run", save_dir=str(tmp_path), version="abc", project="p", offline=True)
    assert (wandb.name, wandb.version, wandb.save_dir, wandb.mode) == ("p", "abc", str(tmp_path), "offline")


def test_module_logs_an_image_grid_through_self_logger_experiment(tmp_path):
    logger = TensorBoardLogger(str(tmp_path / "tb"))
    trainer, module = fit_with(logger, tmp_path)
    assert module.logger is logger and module.loggers == [logger] and trainer.logger is logger
    assert logger.log_dir == str(tmp_path / "tb" / "lightning_logs" / "version_0")
    read = events(logger.log_dir)
    images = read.Images("generated_images")
    assert [image.step for image in images] == [0, 1]  # one grid per epoch end
    grid = torch.sigmoid(module.layer(torch.ones(1, 4))).detach().reshape(3, 2, 2)
    assert (images[-1].width, images[-1].height) == (2, 2)
    import io

    import numpy
    from PIL import Image

    pixels = numpy.asarray(Image.open(io.BytesIO(images[-1].encoded_image_string)).convert("RGB"), dtype=numpy.float32)
    assert numpy.abs(pixels / 255.0 - grid.permute(1, 2, 0).numpy()).max() <= 1 / 255 + 1e-6  # the last epoch's grid
    assert len(read.Scalars("g_loss")) == 2 and abs(read.Scalars("g_loss")[-1].value - trainer.logged_metrics["g_loss"]) < 1e-6
    # A second run with a new logger in the same save_dir gets the next version, as in Lightning.
    again = TensorBoardLogger(str(tmp_path / "tb"))
    fit_with(again, tmp_path)
    assert again.version == 1 and len(events(again.log_dir).Images("generated_images")) == 2


def test_csv_logger_with_lightnings_arguments_writes_its_version_folder(tmp_path):
    logger = CSVLogger(str(tmp_path), name="gan", prefix="p")
    trainer, module = fit_with(logger, tmp_path, MetricsOnly)
    assert module.seen_experiments == ["CSVLogger", "CSVLogger"]
    with open(tmp_path / "gan" / "version_0" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    values = [float(row["p-g_loss"]) for row in rows if row.get("p-g_loss")]
    assert len(values) == 2 and abs(values[-1] - trainer.logged_metrics["g_loss"]) < 1e-6


def test_other_ranks_get_a_dummy_experiment_that_accepts_any_call(tmp_path, monkeypatch):
    from trainer.runtime import distributed

    logger = TensorBoardLogger(str(tmp_path))
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    experiment = logger.experiment
    assert isinstance(experiment, DummyExperiment)
    experiment.add_image("x", torch.zeros(3, 2, 2), 0)
    experiment[0].add_scalar("y", 1.0)
    logger.log_metrics({"a": 1.0}, 0)
    logger.log_hyperparams({"lr": 0.1})
    assert not os.path.exists(logger.log_dir)  # nothing written on rank 1


def test_fast_dev_run_keeps_a_logger_that_writes_nothing(tmp_path):
    trainer, module = fit_with(TensorBoardLogger(str(tmp_path / "tb")), tmp_path, fast_dev_run=1)
    assert isinstance(trainer.logger, DummyLogger) and module.seen_experiments == ["DummyExperiment"]
    assert not os.path.exists(tmp_path / "tb")


def test_default_loggers_put_tensorboard_first_so_images_are_written(tmp_path):
    trainer, module = fit_with(True, tmp_path)  # Lightning's default logger=True
    assert isinstance(trainer.logger, TensorBoardLogger) and trainer.logger.log_dir == str(tmp_path / "run")
    assert [image.step for image in events(str(tmp_path / "run")).Images("generated_images")] == [0, 1]
    assert os.path.isfile(tmp_path / "run" / "metrics.jsonl")


def test_wandb_logger_with_lightnings_arguments_logs_one_run(tmp_path):
    logger = WandbLogger(name="gan", save_dir=str(tmp_path / "wb"), project="p", offline=True, prefix="x")
    trainer, module = fit_with(logger, tmp_path, MetricsOnly)
    assert module.seen_experiments == ["Run", "Run"]  # the W&B run on rank 0
    (run_dir,) = offline_runs(tmp_path / "wb")
    run_id, _, history = wandb_run(os.path.join(run_dir, f"run-{logger.version}.wandb"))
    assert run_id == logger.version
    values = [entry["x-g_loss"] for _, entry in history if "x-g_loss" in entry]
    assert len(values) == 2 and values[-1] == pytest.approx(trainer.logged_metrics["g_loss"], rel=1e-6)
