"""A learning-rate scheduler that is not torch's, as Lightning takes it (checked against Lightning
itself): under manual optimization any object with ``state_dict`` / ``load_state_dict`` whose
``.optimizer`` is one of the optimizers (the module steps it; checkpoints keep and restore its state);
under automatic optimization only where the module overrides ``lr_scheduler_step`` (which then steps
it at its interval), else Lightning's ``MisconfigurationException``. ``trainer.optimizers`` and
``trainer.lr_scheduler_configs`` stay readable after ``fit`` as in Lightning."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as ours
from trainer.lightning.callbacks import ModelCheckpoint
from trainer.lightning.utilities.exceptions import MisconfigurationException

pl = pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.timeout(300)
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class Halving:
    """A scheduler of the user's own: ``step()`` halves the learning rate; ``loaded`` records the states
    ``load_state_dict`` was given."""

    def __init__(self, optimizer):
        self.optimizer, self.steps, self.loaded = optimizer, 0, []

    def step(self):
        self.steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] /= 2

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.loaded.append(dict(state))
        self.steps = state["steps"]


class StatelessScheduler:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        pass


def make_module(package, manual: bool, scheduler_class=Halving, overrides_step: bool = False):
    """A linear layer on 8 samples (2 batches of 4 an epoch) with one ``scheduler_class``; manual:
    ``training_step`` steps the optimizer and, every other batch, the scheduler; ``overrides_step``:
    ``lr_scheduler_step`` records its calls and steps the scheduler."""

    class Module(package.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer, self.automatic_optimization, self.stepped = torch.nn.Linear(2, 1), not manual, []

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            if not manual:
                return loss
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            if batch_idx % 2 == 1:
                self.lr_schedulers().step()

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.8)
            return [optimizer], [{"scheduler": scheduler_class(optimizer), "interval": "step", "frequency": 2}]

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.arange(16.0).view(8, 2) / 10), batch_size=4)

    if overrides_step:
        def lr_scheduler_step(self, scheduler, metric):
            self.stepped.append((self.global_step, metric))
            scheduler.step()

        Module.lr_scheduler_step = lr_scheduler_step
    return Module()


def fit(package, module, root, **flags):
    trainer = package.Trainer(default_root_dir=str(root), enable_checkpointing=False, **{**QUIET, **flags})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return trainer


@pytest.mark.parametrize("manual, overrides_step", [(True, False), (False, True)])
def test_a_scheduler_of_the_users_own_runs_as_in_lightning(tmp_path, manual, overrides_step):
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = make_module(package, manual, overrides_step=overrides_step)
        trainer = fit(package, module, tmp_path / side, max_epochs=3)
        scheduler = module.lr_schedulers()
        runs.append((module, trainer, scheduler))
    (pl_module, pl_trainer, pl_scheduler), (module, trainer, scheduler) = runs
    assert isinstance(scheduler, Halving) and scheduler.steps == pl_scheduler.steps == 3
    assert module.stepped == pl_module.stepped == ([(2, None), (4, None), (6, None)] if overrides_step else [])
    assert [type(c.scheduler) for c in trainer.lr_scheduler_configs] == [Halving]  # (read after fit, as Lightning)
    assert (trainer.lr_scheduler_configs[0].interval, trainer.lr_scheduler_configs[0].frequency) == ("step", 2)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pl_trainer.optimizers[0].param_groups[0]["lr"] == 0.1
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, rtol=1e-6, atol=1e-7)


def test_a_scheduler_of_the_users_own_is_kept_in_checkpoints_by_its_state_dict(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = make_module(ours, manual=True)
    ours.Trainer(default_root_dir=str(tmp_path), max_epochs=2, callbacks=[checkpoint], **QUIET).fit(first)
    resumed = make_module(ours, manual=True)
    trainer = ours.Trainer(default_root_dir=str(tmp_path), max_epochs=3, enable_checkpointing=False, **QUIET)
    trainer.fit(resumed, ckpt_path=checkpoint.last_model_path)
    scheduler = resumed.lr_schedulers()
    assert scheduler.loaded == [{"steps": 2}] and scheduler.steps == 3


def test_a_scheduler_lightning_cannot_step_is_refused_as_lightning_refuses_it(tmp_path):
    # automatic optimization without lr_scheduler_step: Lightning's MisconfigurationException (a ValueError)
    for package, error in ((pl, pl.utilities.exceptions.MisconfigurationException), (ours, MisconfigurationException)):
        with pytest.raises(error, match="doesn't follow PyTorch's LRScheduler API"):
            fit(package, make_module(package, manual=False), tmp_path, max_epochs=0)
    with pytest.raises(ValueError, match=r"lr_scheduler Halving doesn't follow .* override the module's "
                                         r"lr_scheduler_step\(scheduler, metric\) to step it"):
        fit(ours, make_module(ours, manual=False), tmp_path, max_epochs=0)
    # without state_dict / load_state_dict: a TypeError in both modes, as in Lightning
    for manual in (True, False):
        for package in (pl, ours):
            with pytest.raises(TypeError, match="state_dict"):
                fit(package, make_module(package, manual, StatelessScheduler, overrides_step=True), tmp_path,
                    max_epochs=0)


def test_a_manual_scheduler_names_its_optimizer(tmp_path):
    class Detached(Halving):
        def __init__(self, optimizer):
            super().__init__(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))

    class Nameless(Halving):
        def __init__(self, optimizer):
            super().__init__(optimizer)
            del self.optimizer

    with pytest.raises(ValueError, match="lr_scheduler Detached was built on an optimizer that configure_optimizers "
                                         "did not return"):
        fit(ours, make_module(ours, True, Detached), tmp_path, max_epochs=0)
    with pytest.raises(ValueError, match=r"lr_scheduler Nameless has no \.optimizer attribute"):
        fit(ours, make_module(ours, True, Nameless), tmp_path, max_epochs=0)
