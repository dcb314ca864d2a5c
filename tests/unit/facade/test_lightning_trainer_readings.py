"""Lightning's readings of the mirror's Trainer and LightningModule: ``max_epochs`` (None until fit,
then 1000 or -1; 0 trains nothing; -1 no epoch limit), the resume past ``max_epochs`` refused,
``setup`` / ``teardown`` given ``stage=`` as a keyword, ``torch.jit.script`` of a module, a
``DictConfig``'s hyperparameters, the manual-optimization scheduler keys, ``optimizer_idx`` refused
when fit starts, ``PL_TRAINER_DEVICES``, and a ``CSVLogger`` at a ``memory://`` URL."""

from __future__ import annotations

import os

import fsspec
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L
from trainer.lightning.callbacks import ModelCheckpoint
from trainer.lightning.loggers import CSVLogger
from trainer.lightning.utilities.exceptions import MisconfigurationException

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, logger=False)


class Linear(L.LightningModule):
    """A linear layer on 8 fixed samples, batches of 4 (2 steps an epoch); counts its training steps
    and records how ``setup`` / ``teardown`` were called."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.steps = 0
        self.calls: list = []

    def forward(self, x):
        return self.layer(x)

    def setup(self, stage):
        self.calls.append(("setup", stage))

    def teardown(self, stage):
        self.calls.append(("teardown", stage))

    def training_step(self, batch, batch_idx):
        self.steps += 1
        loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        x = torch.arange(16, dtype=torch.float32).reshape(8, 2) / 10
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def test_max_epochs_reads_as_lightnings(tmp_path):
    trainer = L.Trainer(default_root_dir=tmp_path, enable_checkpointing=False, **QUIET)
    assert trainer.max_epochs is None and trainer.max_steps == -1  # (as given, until fit)
    steps = L.Trainer(default_root_dir=tmp_path, max_steps=3, enable_checkpointing=False, **QUIET)
    module = Linear()
    steps.fit(module)
    assert steps.max_epochs == -1 and module.steps == 3 and steps.global_step == 3  # max_steps alone bounds it
    unbounded = L.Trainer(default_root_dir=tmp_path, max_epochs=-1, max_steps=5, enable_checkpointing=False, **QUIET)
    module = Linear()
    unbounded.fit(module)
    assert module.steps == 5 and unbounded.current_epoch == 2  # (no epoch limit: 2 steps an epoch)
    with pytest.raises(ValueError, match=r"Trainer\(max_epochs=-2\): give None, -1 \(no epoch limit\) or an integer"):
        L.Trainer(max_epochs=-2)


def test_max_epochs_zero_trains_nothing_but_checks_the_optimizers(tmp_path):
    trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=0, enable_checkpointing=False, **QUIET)
    module = Linear()
    before = [p.detach().clone() for p in module.parameters()]
    trainer.fit(module)
    assert module.steps == 0 and trainer.global_step == 0 and trainer.max_epochs == 0
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
    assert ("setup", "fit") in module.calls  # (the set-up ran)

    class NotAScheduler:
        def __init__(self, optimizer):
            self.optimizer = optimizer

    class Scheduled(Linear):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [NotAScheduler(optimizer)]

    with pytest.raises(TypeError, match=r"NotAScheduler has no state_dict\(\) / load_state_dict\(\)"):
        L.Trainer(default_root_dir=tmp_path, max_epochs=0, enable_checkpointing=False, **QUIET).fit(Scheduled())


def test_resuming_past_max_epochs_is_lightnings_misconfiguration(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    L.Trainer(default_root_dir=tmp_path, max_epochs=3, callbacks=[checkpoint], **QUIET).fit(Linear())
    last = checkpoint.last_model_path
    assert last.endswith(".ckpt")
    module = Linear()
    with pytest.raises(MisconfigurationException, match=r"You restored a checkpoint with current_epoch=3, past "
                                                         r"Trainer\(max_epochs=1\)"):
        L.Trainer(default_root_dir=tmp_path, max_epochs=1, enable_checkpointing=False, **QUIET).fit(
            module, ckpt_path=last)
    assert module.steps == 0
    at_end = Linear()  # at max_epochs exactly: nothing to train, no error (as Lightning)
    L.Trainer(default_root_dir=tmp_path, max_epochs=3, enable_checkpointing=False, **QUIET).fit(at_end, ckpt_path=last)
    assert at_end.steps == 0
    more = Linear()  # raised: the run continues
    L.Trainer(default_root_dir=tmp_path, max_epochs=4, enable_checkpointing=False, **QUIET).fit(more, ckpt_path=last)
    assert more.steps == 2


def test_setup_and_teardown_get_the_stage_as_a_keyword_where_they_take_one(tmp_path):
    seen = []

    class Data(L.LightningDataModule):
        def setup(self, stage=None, **kwargs):
            seen.append(("setup", stage, kwargs))

        def teardown(self, stage):
            seen.append(("teardown", stage))

        def train_dataloader(self):
            return Linear().train_dataloader()

    class Watcher(L.Callback):
        def setup(self, trainer, pl_module, stage):
            seen.append(("callback setup", stage))

    class OtherName(Linear):
        def setup(self, which):  # (another parameter name: given positionally)
            seen.append(("module setup", which))

    L.Trainer(default_root_dir=tmp_path, max_steps=1, enable_checkpointing=False, callbacks=[Watcher()],
              **QUIET).fit(OtherName(), datamodule=Data())
    assert seen == [("setup", "fit", {}), ("callback setup", "fit"), ("module setup", "fit"), ("teardown", "fit")]
    from trainer.api.hook_calls import call_with_stage

    calls = []
    call_with_stage(lambda *args, **kwargs: calls.append((args, kwargs)), "a", "fit")
    assert calls == [(("a",), {"stage": "fit"})]


def test_a_lightning_module_can_be_scripted(tmp_path):
    module = Linear()
    module.trainer = L.Trainer(default_root_dir=tmp_path, logger=False)  # (its properties are read while scripting)
    scripted = torch.jit.script(module)
    x = torch.randn(3, 2)
    assert torch.equal(scripted(x), module(x))


def test_hyperparameters_saved_from_a_dictconfig_equal_it():
    omegaconf = pytest.importorskip("omegaconf")

    class Data(L.LightningDataModule):
        def __init__(self, config):
            super().__init__()
            self.save_hyperparameters(config)

    config = omegaconf.OmegaConf.create({"hello": "world", "inner": {"n": 1}})
    data = Data(config)
    assert data.hparams == config and not data.hparams != config and data.hparams.inner.n == 1
    assert data.hparams != omegaconf.OmegaConf.create({"hello": "there", "inner": {"n": 1}})
    assert data.hparams == {"hello": "world", "inner": {"n": 1}}


def test_manual_optimization_names_the_scheduler_keys_it_ignores_as_a_runtime_warning(tmp_path):
    class Manual(Linear):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return [optimizer], [{"scheduler": plateau, "monitor": "train_loss", "interval": "step"}]

    trainer = L.Trainer(default_root_dir=tmp_path, max_epochs=1, enable_checkpointing=False, **QUIET)
    with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
        trainer.fit(Manual())


def test_optimizer_idx_is_refused_when_fit_starts(tmp_path):
    class OldStyle(Linear):
        def training_step(self, batch, batch_idx, optimizer_idx):
            return super().training_step(batch, batch_idx)

    module = OldStyle()
    with pytest.raises(RuntimeError, match="Remove the `optimizer_idx` argument from `training_step`"):
        L.Trainer(default_root_dir=tmp_path, max_steps=1, enable_checkpointing=False, **QUIET).fit(module)
    assert module.steps == 0


def test_pl_trainer_devices_gives_the_device_count(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_TRAINER_DEVICES", "2")
    two = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", logger=False)
    assert two.num_devices == 2 and two.strategy.name == "ddp"  # (Lightning's strategy="auto")
    assert L.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False).num_devices == 1


def test_csv_logger_at_a_url_writes_through_fsspec_and_nothing_locally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = "memory://csv_logger_at_a_url"
    fs, _ = fsspec.core.url_to_fs(url)
    try:
        logger = CSVLogger(save_dir=url)
        assert logger.version == 0
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"loss": 0.5}, step=0)
        logger.log_metrics({"acc": 1.0}, step=0)  # (the same row)
        logger.log_metrics({"loss": 0.25}, step=1)
        logger.experiment.save()
        path = os.path.join(logger.log_dir, "metrics.csv")
        with fs.open(path, "r") as f:
            assert f.read() == "step,loss,acc\n0,0.5,1.0\n1,0.25,\n"
        assert fs.isfile(os.path.join(logger.log_dir, "hparams.yaml"))
        assert logger.rows_up_to(0) == [(0, {"loss": 0.5, "acc": 1.0})]
        logger.finalize()
        assert CSVLogger(save_dir=url).version == 1  # (the next free version, read through fsspec)
        assert os.listdir(tmp_path) == []
    finally:
        fs.rm("/csv_logger_at_a_url", recursive=True)
