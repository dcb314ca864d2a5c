"""``trainer.lightning``: Lightning's import paths over the trainer's own implementations. Every public
name of Lightning's modules either imports (and is ours) or fails at import time with what to use."""

from __future__ import annotations

import importlib
import logging
import math

import pytest
import torch

import trainer.lightning as L
from trainer import DataModule, TrainModule, Trainer
from trainer.api.callback import Callback

#: Lightning module -> its mirror
MIRRORED = {
    "lightning": "trainer.lightning",
    "lightning.pytorch": "trainer.lightning",
    "lightning.pytorch.callbacks": "trainer.lightning.callbacks",
    "lightning.pytorch.loggers": "trainer.lightning.loggers",
    "lightning.pytorch.utilities": "trainer.lightning.utilities",
    "lightning.pytorch.core": "trainer.lightning.core",
}


def test_the_top_level_names_are_the_trainers():
    assert issubclass(L.LightningModule, TrainModule) and issubclass(L.LightningDataModule, DataModule)
    # Lightning's Trainer: ours with Lightning's defaults (trainer/lightning/trainer.py)
    assert issubclass(L.Trainer, Trainer) and L.Callback is Callback
    # (max_epochs: None until fit sets Lightning's 1000; trainer/lightning/trainer/trainer.py)
    assert (L.Trainer().max_epochs, L.Trainer().check_val_every_n_epoch, L.Trainer().log_every_n_steps) == (None, 1, 50)
    assert L.pytorch.callbacks is L.callbacks and L.pytorch.LightningModule is L.LightningModule
    from trainer.api.optimizer import LightningOptimizer

    assert importlib.import_module("trainer.lightning.core.optimizer").LightningOptimizer is LightningOptimizer
    types = importlib.import_module("trainer.lightning.utilities.types")
    assert {"STEP_OUTPUT", "OptimizerLRScheduler", "TRAIN_DATALOADERS", "EVAL_DATALOADERS"} <= set(vars(types))
    assert isinstance(importlib.import_module("trainer.lightning.fabric.utilities.imports")._IS_WINDOWS, bool)
    assert isinstance(importlib.import_module("trainer.lightning.utilities.imports")._TORCHVISION_AVAILABLE, bool)


@pytest.mark.parametrize("lightning_name", sorted(MIRRORED))
def test_every_public_lightning_name_imports_or_says_what_to_use(lightning_name):
    lightning = pytest.importorskip(lightning_name, reason="lightning (a dev dependency) lists the names to mirror")
    mirror = importlib.import_module(MIRRORED[lightning_name])
    for name in [n for n in lightning.__all__ if n != "__version__"]:
        try:
            getattr(mirror, name)
        except ImportError as error:
            assert "use " in str(error) and name in str(error), (lightning_name, name, str(error))
        except AttributeError:
            pytest.fail(f"{MIRRORED[lightning_name]}.{name}: neither mirrored nor refused with what to use")


@pytest.mark.parametrize("path", [
    "trainer.lightning.callbacks.early_stopping:EarlyStopping", "trainer.lightning.callbacks.timer:Timer",
    "trainer.lightning.callbacks.lr_monitor:LearningRateMonitor", "trainer.lightning.callbacks.progress:TQDMProgressBar",
    "trainer.lightning.loggers.tensorboard:TensorBoardLogger", "trainer.lightning.loggers.wandb:WandbLogger",
    "trainer.lightning.loggers.csv_logs:CSVLogger", "trainer.lightning.loggers.logger:Logger",
    "trainer.lightning.loggers.mlflow:MLFlowLogger",
    "trainer.lightning.core.module:LightningModule", "trainer.lightning.core.datamodule:LightningDataModule",
    "trainer.lightning.utilities.rank_zero:rank_zero_only", "trainer.lightning.utilities.grads:grad_norm",
    "trainer.lightning.fabric.utilities.seed:seed_everything", "trainer.lightning.fabric.utilities.rank_zero:rank_zero_info",
])
def test_lightnings_module_paths_hold_the_same_names(path):
    module, name = path.split(":")
    same = next(getattr(m, name) for m in (L, L.callbacks, L.loggers, L.utilities) if name in m.__all__)
    assert getattr(importlib.import_module(module), name) is same


def test_unknown_names_stay_attribute_errors():
    assert not hasattr(L, "NoSuchLightningName") and not hasattr(L.callbacks, "NoSuchCallback")


def test_lightning_module_takes_lightnings_constructor():
    class Model(L.LightningModule):
        def __init__(self, width):
            super().__init__()
            self.layer = torch.nn.Linear(width, 1)

    assert Model(3).layer.in_features == 3
    with pytest.raises(TypeError, match="LightningModule.__init__\\(\\) takes no arguments, got 3"):
        L.LightningModule(3)


def test_rank_zero_helpers_read_the_rank(monkeypatch):
    from trainer.lightning.utilities import rank_zero_only

    calls = []
    record = rank_zero_only(lambda x: calls.append(x) or x)
    assert record(1) == 1 and rank_zero_only.rank == 0
    monkeypatch.setenv("RANK", "1")
    assert record(2) is None and rank_zero_only.rank == 1 and calls == [1]
    assert rank_zero_only(lambda: 5, default=7)() == 7


def test_grad_norm_is_each_gradients_norm_and_their_total():
    from trainer.lightning.utilities import grad_norm

    layer = torch.nn.Linear(3, 2)
    layer(torch.ones(4, 3)).pow(2).sum().backward()
    norms = grad_norm(layer, norm_type=2)
    weight, bias = layer.weight.grad.norm(), layer.bias.grad.norm()
    assert set(norms) == {"grad_2.0_norm/weight", "grad_2.0_norm/bias", "grad_2.0_norm_total"}
    assert norms["grad_2.0_norm/weight"] == pytest.approx(weight.item())
    assert norms["grad_2.0_norm_total"] == pytest.approx(math.hypot(weight.item(), bias.item()), rel=1e-6)
    with pytest.raises(ValueError, match="positive"):
        grad_norm(layer, 0)


def test_seed_everything_returns_the_seed_and_seeds_torch():
    assert L.seed_everything(5) == 5
    first = torch.rand(3)
    L.seed_everything(5, workers=True)
    assert torch.equal(torch.rand(3), first)
    with pytest.raises(ValueError, match="the seed must be an integer"):
        L.seed_everything(-1)


def test_callbacks_take_lightnings_arguments_in_lightnings_order(caplog):
    from trainer.lightning.callbacks import EarlyStopping, LearningRateMonitor, Timer, TQDMProgressBar

    stopping = EarlyStopping("val_loss", 0.5, 7, False, "max")  # monitor, min_delta, patience, verbose, mode
    assert (stopping.monitor, stopping.min_delta, stopping.patience, stopping.mode) == ("val_loss", 0.5, 7, "max")
    assert EarlyStopping("val_loss", divergence_threshold=3.0).divergence_threshold == 3.0
    assert Timer("00:00:02:00").max_time_s == 120 and Timer({"minutes": 1}).check_every_n_steps == 1
    for bad in (dict(duration=None), dict(duration="00:00:01:00", interval="batch")):
        with pytest.raises(ValueError, match="Timer"):
            Timer(**bad)
    assert LearningRateMonitor("step", log_momentum=True).log_momentum
    with caplog.at_level(logging.WARNING):
        TQDMProgressBar()
        assert not caplog.records
        TQDMProgressBar(refresh_rate=20)
    assert "TQDMProgressBar(refresh_rate=20) is ignored" in caplog.text


def test_the_readme_import_lines_run_as_written():
    import os
    import re

    from tests.support.helpers import REPO

    with open(os.path.join(REPO, "README.md")) as f:
        section = f.read().split("## Coming from Lightning", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    names: dict = {}
    exec(code, names)  # the port's import lines, as the README gives them
    assert names["L"].LightningModule is not None and names["ModelCheckpoint"] is not None


def test_a_fractional_val_check_interval_without_epochs_is_lightnings_error():
    from trainer.lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"val_check_interval=0.5, check_val_every_n_epoch=None"):
        L.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    assert L.Trainer(val_check_interval=2, check_val_every_n_epoch=None, logger=False).val_every_n_steps == 2
