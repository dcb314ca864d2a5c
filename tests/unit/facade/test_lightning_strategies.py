"""Lightning's ``lightning.pytorch.strategies`` names as a program checks ``trainer.strategy`` against them,
``trainer.strategy.num_processes``, and ``utilities.model_helpers.get_torchvision_model``."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L
from trainer.lightning.strategies import DDPStrategy, FSDPStrategy, ParallelStrategy, SingleDeviceStrategy, Strategy
from trainer.lightning.utilities.model_helpers import get_torchvision_model


@pytest.mark.parametrize("name, parallel, kind", [
    ("single", False, SingleDeviceStrategy), ("ddp", True, DDPStrategy), ("fsdp", True, FSDPStrategy),
])
def test_the_run_strategy_is_checked_as_under_lightning(name, parallel, kind):
    strategy = L.Trainer(strategy=name, devices=1, logger=False).strategy
    assert isinstance(strategy, Strategy) and isinstance(strategy, kind)
    assert isinstance(strategy, ParallelStrategy) is parallel
    assert issubclass(type(strategy), ParallelStrategy) is parallel
    assert strategy.num_processes == 1  # before the run: this process alone


def test_parallel_strategy_is_a_check_not_a_strategy_to_build():
    with pytest.raises(TypeError, match=r"isinstance\(trainer.strategy, ParallelStrategy\).*strategy='ddp'"):
        ParallelStrategy()
    assert not isinstance(object(), ParallelStrategy)


def test_lightnings_other_strategies_say_what_to_use():
    with pytest.raises(ImportError, match=r"lightning\.pytorch\.strategies\.DeepSpeedStrategy .*use Trainer\(strategy="):
        from trainer.lightning.strategies import DeepSpeedStrategy  # noqa: F401


class _Program(L.LightningModule):
    """Divides its batch size by the processes on this machine in setup, as Lightning's ImageNet example."""

    def __init__(self):
        super().__init__()
        self.layer, self.batch_size, self.seen = torch.nn.Linear(2, 1), 8, None

    def setup(self, stage):
        if isinstance(self.trainer.strategy, ParallelStrategy):
            self.batch_size = self.batch_size // max(1, self.trainer.strategy.num_processes)
        self.seen = (type(self.trainer.strategy).__name__, self.batch_size)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=self.batch_size)


def test_a_program_reads_the_strategy_in_setup(tmp_path):
    module = _Program()
    L.Trainer(max_steps=1, strategy="ddp", devices=1, default_root_dir=str(tmp_path), logger=False,
              enable_checkpointing=False).fit(module)
    assert module.seen == ("DDPStrategy", 8)  # one process on this machine


def test_get_torchvision_model_builds_torchvisions_model(monkeypatch):
    built = []
    models = types.SimpleNamespace(get_model=lambda name, **kwargs: built.append((name, kwargs)) or "a model")
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(models=models))
    assert get_torchvision_model("resnet18", weights=None) == "a model"
    assert built == [("resnet18", {"weights": None})]
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ModuleNotFoundError, match=r"get_torchvision_model\('resnet18'\) needs torchvision"):
        get_torchvision_model("resnet18")
