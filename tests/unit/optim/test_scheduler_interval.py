"""How often a scheduler returned without an ``interval`` steps: every optimizer step for a
``TrainModule``, every epoch for a ``LightningModule`` (Lightning's default, checked against
Lightning itself), and a bad ``scheduler_interval`` is an error naming it."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule
from trainer.lightning import LightningModule
from trainer.optim.optimizers import configure_optimizers

EPOCHS, BATCHES = 2, 3


def _step_lr(module: torch.nn.Module):
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class _Ours(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def configure_optimizers(self):
        return _step_lr(self)


class _Ported(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def train_dataloader(self):
        data = TensorDataset(torch.randn(4 * BATCHES, 2), torch.randn(4 * BATCHES, 1))
        return DataLoader(data, batch_size=4)

    def configure_optimizers(self):
        return _step_lr(self)


def test_a_train_modules_scheduler_steps_every_step_a_lightning_modules_every_epoch():
    assert configure_optimizers(_Ours())[1][0].interval == "step"
    assert configure_optimizers(_Ported())[1][0].interval == "epoch"


def test_an_interval_the_scheduler_dict_gives_wins_over_the_default():
    class Explicit(_Ported):
        def configure_optimizers(self):
            (optimizer,), (scheduler,) = _step_lr(self)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    assert configure_optimizers(Explicit())[1][0].interval == "step"


def test_a_bad_scheduler_interval_is_an_error_naming_it():
    class Bad(_Ours):
        scheduler_interval = "batch"

    with pytest.raises(ValueError, match=r"Bad.scheduler_interval='batch'; the intervals are \['step', 'epoch'\]"):
        configure_optimizers(Bad())


def _final_lr(trainer_class, module, tmp_path) -> float:
    torch.manual_seed(0)
    trainer = trainer_class(max_epochs=EPOCHS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu",
                            devices=1)
    trainer.fit(module)
    return module.lr_schedulers().optimizer.param_groups[0]["lr"]


def test_a_ported_programs_schedule_is_lightnings(tmp_path):
    lightning = pytest.importorskip("lightning.pytorch")
    from trainer.lightning import Trainer

    class UnderLightning(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        training_step = _Ported.training_step
        train_dataloader = _Ported.train_dataloader
        configure_optimizers = _Ported.configure_optimizers

    expected = _final_lr(lightning.Trainer, UnderLightning(), tmp_path / "lightning")
    assert expected == 0.5 ** EPOCHS  # once per epoch: the oracle's meaning, which this test guards
    assert _final_lr(Trainer, _Ported(), tmp_path / "ours") == expected
