"""Lightning's Trainer names: aliases that mean the same, run limits with our
world-size independent units, the sanity validation, and errors naming ours for the rest.

Most tests build a Trainer (nothing runs) or fit a Regressor for a few steps in one process; one
compares 1 process with 2 DDP ranks, one runs ``train.py`` once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.support.helpers import REPO, Regressor, read_metrics, run_trainer, train_losses
from tests.unit.facade.test_config_keys import composed
from trainer import Trainer
from trainer.cli.hydra_app import build
from trainer.api.lightning_names import resolve_devices

pytestmark = pytest.mark.timeout(240)


# ----- aliases -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, ours", [("32", "fp32"), ("32-true", "fp32"), (32, "fp32"), ("16-mixed", "fp16-mixed"),
                                         (16, "fp16-mixed"), ("bf16-mixed", "bf16-mixed"), ("bf16-true", "bf16-true")])
def test_lightning_precision_names_map_to_ours(given, ours):
    precision = Trainer(precision=given).precision
    assert precision.name == ours
    assert (precision.scaler is not None) == (ours == "fp16-mixed")  # 16-mixed scales the loss, as ours


def test_strategy_and_devices_auto(monkeypatch):
    assert Trainer(strategy="auto").strategy.name == "single"
    assert Trainer(strategy="auto", devices=2).strategy.name == "ddp"
    assert Trainer(devices="auto").devices == 1  # CPU: one process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_devices("auto", "auto") == 4  # a process per GPU
    assert resolve_devices("auto", "cpu") == 1  # not on CUDA: one
    torchrun = SimpleNamespace(external=True, local_world_size=3)
    assert resolve_devices("auto", "auto", torchrun) == 3  # under a launcher: its processes per node


def test_hydra_takes_the_same_names(tmp_path):
    trainer, _ = build(composed(["recipe=mlp", "trainer.precision=16-mixed", "trainer.devices=auto",
                                 "trainer.limit_train_batches=3", "trainer.limit_val_batches=0.5",
                                 "trainer.val_every_n_steps=null", "trainer.val_check_interval=0.25",
                                 "trainer.check_val_every_n_epoch=2", "trainer.num_sanity_val_steps=0",
                                 "trainer.fast_dev_run=false"]), str(tmp_path))
    assert (trainer.precision.name, trainer.devices) == ("fp16-mixed", 1)
    assert (trainer.limit_train_batches, trainer.limit_val_batches, trainer.val_check_fraction) == (3, 0.5, 0.25)
    assert (trainer.check_val_every_n_epoch, trainer.num_sanity_val_steps) == (2, 0)
    # trainer.precision and the precision group agree: the group's instance (with its scaler options) is kept
    same, _ = build(composed(["recipe=mlp", "precision=fp16-mixed", "precision.initial_scale_power=4",
                              "trainer.precision=16"]), str(tmp_path))
    assert same.precision.scaler.scale == 16.0


@pytest.mark.parametrize("overrides, message", [
    (["trainer.precision=15"], "trainer.precision=15 is not a precision; allowed: '32', '32-true', 32"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches=-1: passed invalid value; give an integer >= 0"),
    (["trainer.limit_train_batches=1.5"], "trainer.limit_train_batches=1.5: passed invalid value; give an integer >= 0"),
    (["trainer.val_check_interval=3"], "trainer.val_check_interval=3 and trainer.val_every_n_steps=50 mean the same"),
    (["trainer.num_sanity_val_steps=-2"], "trainer.num_sanity_val_steps=-2: give an integer >= 0"),
    (["trainer.fast_dev_run=-1"], "trainer.fast_dev_run=-1: should be >= 0; give true, false or an integer >= 0"),
    (["trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch=0: give an integer >= 1"),
    (["trainer.devices=some"], "trainer.devices must be an integer >= 1, got 'some' (or 'auto')"),
    (["trainer.precision=bf16-mixed", "precision=fp16-mixed"], "trainer.precision=bf16-mixed (bf16-mixed) and "
                                                                 "precision=fp16-mixed differ"),
    (["trainer.default_root_dir=/tmp/x"], "set hydra.run.dir=/tmp/x instead"),
    (["+trainer.logger=x"], "trainer.logger is not a trainer setting; .*Lightning's logger is the logger group"),
    (["+trainer.enable_checkpointing=false"], "trainer.enable_checkpointing is not a trainer setting; .*checkpoint=null"),
])
def test_bad_values_are_refused_naming_what_is_allowed(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message if ".*" in message else re.escape(message)):
        build(composed(["recipe=mlp", *overrides]), str(tmp_path))


def test_unknown_arguments_name_ours():
    with pytest.raises(TypeError, match=r"'profiler' \(Lightning's\).*use profile="):
        Trainer(profiler="simple")
    with pytest.raises(TypeError, match=r"'max_step' is not a Trainer argument; did you mean max_steps"):
        Trainer(max_step=3)
    with pytest.raises(ValueError, match=r"default_root_dir='a' and run_dir='b' name the same directory"):
        Trainer(default_root_dir="a", run_dir="b")
    assert Trainer(default_root_dir="a").run_dir == "a"
    assert Trainer(val_check_interval=5).val_every_n_steps == 5
    assert Trainer(val_check_interval=5, val_every_n_steps=5).val_every_n_steps == 5


def test_cli_takes_lightning_names_and_refuses_a_bad_value_before_spawning(tmp_path):
    base = [sys.executable, "train.py", "recipe=mlp", "logger=[jsonl]", "trainer.progress_bar=false"]
    run = subprocess.run([*base, f"hydra.run.dir={tmp_path}", "trainer.precision=32-true", "trainer.devices=auto",
                          "trainer.max_epochs=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
                          "trainer.val_every_n_steps=null", "trainer.check_val_every_n_epoch=1",
                          "trainer.log_every_n_steps=1"],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    records = read_metrics(str(tmp_path))
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]  # 2 epochs of 2 steps
    assert [r["step"] for r in records if "val/loss" in r] == [2, 4]  # each epoch end
    bad = subprocess.run([*base, f"hydra.run.dir={tmp_path / 'bad'}", "strategy=ddp", "trainer.devices=2",
                          "trainer.limit_val_batches=-1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1].startswith("error: trainer.limit_val_batches=-1: passed invalid value; give an integer >= 0")
    assert "rank 1" not in bad.stderr  # refused before any worker started


# ----- run limits --------------------------------------------------------------------------------------
class ValidationCounter(Regressor):
    """Counts this rank's validation batches and samples; records the training micro-batches."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.val_batches = self.val_samples_seen = self.train_batches = 0

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        self.val_batches += 1
        self.val_samples_seen += len(batch[0])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.train_batches += 1


def test_fast_dev_run(tmp_path):
    module = ValidationCounter(val_samples=64)
    trainer = Trainer(fast_dev_run=2, run_dir=str(tmp_path), batch_size=8, progress_bar=False,
                      checkpoint=dict(every_n_steps=1), loggers=["jsonl"])
    trainer.fit(module)
    assert trainer.global_step == 2 and module.train_batches == 2
    assert module.val_batches == 2  # the final validation only, 2 batches; no sanity pass
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    assert Trainer(fast_dev_run=True).max_steps == 1


def test_limits_count_the_same_on_one_and_two_ranks(tmp_path):
    # limit_train_batches: optimizer steps per epoch; limit_val_batches: global validation batches.
    args = dict(max_steps=-1, max_epochs=2, limit_train_batches=3, limit_val_batches=2, check_val_every_n_epoch=1,
                num_sanity_val_steps=0)
    run_trainer(tmp_path / "one", ValidationCounter(val_samples=100), batch_size=16, **args)
    run_trainer(tmp_path / "two", ValidationCounter(val_samples=100), batch_size=8, strategy="ddp", devices=2,
                collective_timeout_s=60, **args)
    one, two = read_metrics(str(tmp_path / "one")), read_metrics(str(tmp_path / "two"))
    assert [r["step"] for r in one if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in one if "val/loss" in r] == [3, 6]
    assert [r["step"] for r in two if "val/loss" in r] == [3, 6]
    # The same samples (32 of 100): the same means, up to the all-reduce's summation order.
    tol = dict(rtol=1e-5, atol=1e-6)
    for key in ("train/loss", "val/loss"):
        torch.testing.assert_close(torch.tensor([r[key] for r in two if key in r]),
                                   torch.tensor([r[key] for r in one if key in r]), **tol)
    full = ValidationCounter(val_samples=100)
    run_trainer(tmp_path / "full", full, batch_size=16, max_steps=1, num_sanity_val_steps=0)
    limited = ValidationCounter(val_samples=100)
    run_trainer(tmp_path / "limited", limited, batch_size=16, max_steps=1, num_sanity_val_steps=0, limit_val_batches=2)
    assert (full.val_samples_seen, limited.val_samples_seen) == (100, 32)
    fraction = ValidationCounter(val_samples=100)
    run_trainer(tmp_path / "fraction", fraction, batch_size=16, max_steps=1, num_sanity_val_steps=0, limit_val_batches=0.25)
    assert fraction.val_samples_seen == 16  # a quarter of the 7 batches of 16, rounded down (Lightning's): 1 batch


def test_val_check_interval_fraction_of_an_epoch(tmp_path):
    # 200 samples / 16 = 13 steps per epoch, limited to 8: a quarter is every 2 steps.
    run_trainer(tmp_path, Regressor(val_samples=32), batch_size=16, max_steps=-1, max_epochs=1, limit_train_batches=8,
                val_check_interval=0.25, num_sanity_val_steps=0)
    assert [r["step"] for r in read_metrics(str(tmp_path)) if "val/loss" in r] == [2, 4, 6, 8]


# ----- sanity validation -------------------------------------------------------------------------------
class NoisyValidation(Regressor):
    """Dropout in training and random numbers drawn in validation_step: a sanity pass that touched the
    random states would change the training losses."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.sanity_batches = 0

    def validation_step(self, batch, batch_idx):
        self.sanity_batches += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self(x + torch.randn_like(x)), y)


def test_sanity_validation_leaves_the_training_stream_bitwise_equal(tmp_path):
    without = NoisyValidation(val_samples=32)
    run_trainer(tmp_path / "without", without, max_steps=6, batch_size=8, num_sanity_val_steps=0)
    with_sanity = NoisyValidation(val_samples=32)
    run_trainer(tmp_path / "with", with_sanity, max_steps=6, batch_size=8)  # the default: 2 batches
    assert with_sanity.sanity_batches == without.sanity_batches + 2  # it ran (and the final validation too)
    assert train_losses(str(tmp_path / "with")) == train_losses(str(tmp_path / "without"))  # bitwise
    logged = [r for r in read_metrics(str(tmp_path / "with")) if "val/loss" in r]
    assert [r["step"] for r in logged] == [6]  # the sanity pass logged nothing


class BrokenValidation(Regressor):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps_run = 0

    def on_train_batch_start(self, batch, batch_idx):
        self.steps_run += 1

    def validation_step(self, batch, batch_idx):
        raise RuntimeError("broken validation_step")


def test_a_broken_validation_step_fails_before_the_first_step(tmp_path):
    module = BrokenValidation(val_samples=32)
    with pytest.raises(RuntimeError, match="broken validation_step"):
        run_trainer(tmp_path, module, max_steps=100, val_every_n_steps=50)
    assert module.steps_run == 0
    run_trainer(tmp_path / "off", BrokenValidation(), max_steps=1, num_sanity_val_steps=0)  # no validation data: none


def test_validation_settings_without_validation_data_warn(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=1, limit_val_batches=2, check_val_every_n_epoch=1)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith("trainer.limit_val_batches=2, trainer.check_val_every_n_epoch=1: Regressor has no "
                            "val_dataset()") for w in warned), warned
