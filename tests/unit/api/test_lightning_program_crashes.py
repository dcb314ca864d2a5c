"""Lightning programs that crashed here, run under Lightning itself (the oracle) and under the mirror:
a hook set to None, a KeyboardInterrupt in a hook, a logger whose ``finalize`` needs its status, a
checkpoint ``dirpath`` under ``~``, ``self.log`` of a value that cannot be logged."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L

pl = pytest.importorskip("lightning.pytorch", reason="lightning (a dev dependency) is the oracle")
APIS = {"lightning": pl, "ours": L}


def _module(api):
    class Tiny(api.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("v", self.layer(batch[0]).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

        val_dataloader = train_dataloader

    return Tiny()


def _trainer(api, root, **kwargs):
    settings = dict(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, default_root_dir=str(root))
    settings.update(kwargs)
    return api.Trainer(**settings, **({"accelerator": "cpu"} if api is pl else {}))


def test_a_data_hook_set_to_none_is_not_defined(tmp_path):
    results = {}
    for side, api in APIS.items():
        module = _module(api)
        module.val_dataloader = None  # Lightning: no validation data
        trainer = _trainer(api, tmp_path / side)
        trainer.fit(module)
        results[side] = (trainer.global_step, "v" in trainer.callback_metrics)
    assert results["ours"] == results["lightning"] == (2, False)


def _logger_class(api, seen):
    class StatusLogger(api.loggers.Logger):
        name, version = "status", 0

        @property
        def experiment(self):
            return None

        def log_hyperparams(self, params, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            pass

        def finalize(self, status):  # Lightning's signature: the status is required
            seen.append(status)

    return StatusLogger


def test_a_logger_is_finalized_with_the_runs_status(tmp_path):
    statuses = {}
    for side, api in APIS.items():
        statuses[side] = seen = []
        _trainer(api, tmp_path / side, logger=_logger_class(api, seen)(), max_steps=1).fit(_module(api))
    assert statuses["ours"][-1:] == statuses["lightning"][-1:] == ["success"]


def test_a_keyboard_interrupt_in_a_hook_shuts_down_as_lightnings(tmp_path):
    outcomes = {}
    for side, api in APIS.items():
        seen = []

        class Interrupts(api.Callback):
            def on_train_batch_end(self, *args):
                raise KeyboardInterrupt

            def on_exception(self, trainer, module, exception):
                seen.append(type(exception).__name__)

        trainer = _trainer(api, tmp_path / side, callbacks=[Interrupts()], logger=_logger_class(api, seen)())
        sigint = signal.getsignal(signal.SIGINT)
        try:
            with pytest.raises(SystemExit) as exit_:
                trainer.fit(_module(api))
        finally:
            signal.signal(signal.SIGINT, sigint)  # (Lightning ignores Ctrl+C from then on)
        outcomes[side] = (exit_.value.code, seen, trainer.state.status == "interrupted", trainer.state.finished)
    assert outcomes["ours"] == outcomes["lightning"] == (1, ["KeyboardInterrupt", "failed"], True, False)


def test_a_checkpoint_dirpath_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    dirpaths = {side: os.path.realpath(api.callbacks.ModelCheckpoint(dirpath="~/checkpoints").dirpath)
                for side, api in APIS.items()}
    assert dirpaths["ours"] == dirpaths["lightning"] == os.path.realpath(tmp_path / "home" / "checkpoints")


def test_self_log_of_a_value_that_cannot_be_logged_is_a_value_error(tmp_path):
    values = {"a string": "x", "a list": [1.0], "a dict": {"a": "b"}, "None": None, "two elements": torch.ones(2)}
    errors = {}
    for side, api in APIS.items():
        errors[side] = caught = {}

        class LogsBadValues(type(_module(api))):
            def training_step(self, batch, batch_idx):
                for what, value in values.items():
                    try:
                        self.log("bad", value)
                    except Exception as error:  # noqa: BLE001 (the error's type is what is compared)
                        caught[what] = type(error).__name__
                return super().training_step(batch, batch_idx)

        _trainer(api, tmp_path / side, max_steps=1, limit_val_batches=1, num_sanity_val_steps=0).fit(LogsBadValues())
    assert errors["ours"] == errors["lightning"] == {what: "ValueError" for what in values}
