"""Settings that used to be dropped without a word: each is now honoured,
refused with an error naming it, or (when it only changes what is shown) warned about once.

One process, two steps each: a second or so per test.
"""

from __future__ import annotations

import logging
from functools import partial

import pytest
import torch

from tests.support.helpers import Regressor, new_trainer, run_trainer
from trainer import Trainer
from trainer.callbacks import EarlyStopping
from trainer.api.module import TrainModule
from trainer.strategies.single import SingleDeviceStrategy


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("trainer")]


class NoValidationStep(Regressor):
    validation_step = TrainModule.validation_step  # validation data, but no step to compute metrics


def test_early_stopping_without_validation_data_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"EarlyStopping\(monitor='val/loss'\) needs validation metrics, but "
                                         r"Regressor has no val_dataset\(\)"):
        run_trainer(tmp_path, Regressor(), max_steps=2, callbacks=[EarlyStopping()])


def test_val_every_n_steps_without_validation_data_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=2, val_every_n_steps=1)
    warned = [w for w in warnings_in(caplog) if "trainer.val_every_n_steps=1" in w]
    assert len(warned) == 1 and "Regressor has no val_dataset()" in warned[0], warnings_in(caplog)


class DropLastValNoStep(NoValidationStep):
    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_dataset(), batch_size=5, drop_last=True)


@pytest.mark.parametrize("module", [NoValidationStep(val_samples=16), DropLastValNoStep(val_samples=16)])
def test_validation_data_without_validation_step_skips_validation_with_one_warning(tmp_path, caplog, module):
    """As Lightning: no validation_step, no validation (a drop_last loader is then not refused either)."""
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer = new_trainer(tmp_path, max_steps=2, val_every_n_steps=1)
        trainer.fit(module)
    warned = [w for w in warnings_in(caplog) if "does not override validation_step()" in w]
    assert len(warned) == 1 and warned[0].startswith(f"{type(module).__name__} has validation data"), warnings_in(caplog)
    assert "validation is skipped" in warned[0]
    assert not [name for name in trainer.logged_metrics if name.startswith("val/")]
    with pytest.raises(ValueError, match=r"Trainer.validate: .* does not override validation_step\(\)"):
        trainer.validate(module)


def test_module_with_validation_gives_no_validation_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(val_samples=16), max_steps=2, val_every_n_steps=1)
    assert not [w for w in warnings_in(caplog) if "valid" in w], warnings_in(caplog)


def test_trace_window_after_the_run_warns(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=2, profile={"trace_steps": [5, 6]})
    warned = [w for w in warnings_in(caplog) if "trace_steps" in w]
    assert warned == ["trainer.profile.trace_steps=[5, 6]: this run trained steps 1..2, so no trace was written"]
    assert not (tmp_path / "profiler").exists()


def test_accelerator_that_differs_from_the_strategy_instance_is_an_error():
    with pytest.raises(ValueError, match=r"trainer.accelerator='cuda' differs from the strategy's accelerator='cpu'"):
        Trainer(strategy=SingleDeviceStrategy(accelerator="cpu"), accelerator="cuda")
    assert Trainer(strategy=SingleDeviceStrategy(accelerator="cpu"), accelerator="cpu").strategy.accelerator == "cpu"
    assert Trainer(strategy=SingleDeviceStrategy(accelerator="cpu")).strategy.accelerator == "cpu"  # "auto": the strategy's


class LightningOneHooks(Regressor):
    def training_epoch_end(self, outputs):  # Lightning 1.x: removed in Lightning 2, never called here
        raise AssertionError("not reached")


class CallbackWithLightningOneHook(EarlyStopping):
    def on_epoch_end(self, trainer, module):  # Lightning 1.x: removed in Lightning 2
        raise AssertionError("not reached")


def test_a_lightning_one_hook_the_trainer_never_calls_is_an_error(tmp_path):
    with pytest.raises(TypeError, match=r"LightningOneHooks defines training_epoch_end\(\), Lightning 1.x hook\(s\) that "
                                        r"Lightning 2 removed.*training_epoch_end\(\) -> on_train_epoch_end"):
        run_trainer(tmp_path, LightningOneHooks(), max_steps=2)
    with pytest.raises(TypeError, match=r"CallbackWithLightningOneHook defines on_epoch_end\(\).*on_train_epoch_end"):
        Trainer(callbacks=[CallbackWithLightningOneHook()])


class OwnOptimizer(Regressor):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class FactoryInOverride(Regressor):
    def configure_optimizers(self):
        return self.optimizer_factory([{"params": self.net[0].parameters()}, {"params": self.net[2].parameters()}])


def test_an_optimizer_factory_that_configure_optimizers_ignores_is_an_error(tmp_path):
    module = OwnOptimizer()
    module.optimizer_factory = partial(torch.optim.SGD, lr=0.5)  # what the Hydra optimizer group passes
    with pytest.raises(ValueError, match=r"OwnOptimizer was given optimizer=SGD\(lr=0.5\) \(the optimizer config "
                                         r"group\), but its configure_optimizers\(\) does not use it"):
        run_trainer(tmp_path, module, max_steps=2)
    used = FactoryInOverride()
    used.optimizer_factory = partial(torch.optim.SGD, lr=0.5)
    run_trainer(tmp_path / "used", used, max_steps=2)
    assert used.optimizer_factory.keywords == {"lr": 0.5}  # given back as it was


# ----- the rest of the audit's list (each was silent before) ------------------------------------------------
def test_comms_window_after_the_run_warns(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=2, profile={"comms_steps": [5, 6]})
    warned = [w for w in warnings_in(caplog) if "comms_steps" in w]
    assert len(warned) == 1 and "ended before step 6" in warned[0], warnings_in(caplog)
    assert not (tmp_path / "comms").exists()


def test_sync_batchnorm_that_cannot_change_anything_warns(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=2, sync_batchnorm=True)
    assert [w for w in warnings_in(caplog) if "has no BatchNorm1d/2d/3d layer" in w], warnings_in(caplog)


class WithBatchNorm(Regressor):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1))


def test_sync_batchnorm_on_one_rank_warns(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, WithBatchNorm(), max_steps=2, sync_batchnorm=True)
    assert [w for w in warnings_in(caplog) if "with one data-parallel rank" in w], warnings_in(caplog)


def test_validate_without_validation_data_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"Trainer.validate: Regressor has no validation data"):
        Trainer(run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False).validate(Regressor())


def test_checkpoint_monitor_of_validation_without_validation_data_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint.monitor='val/loss', but Regressor has no val_dataset"):
        run_trainer(tmp_path, Regressor(), max_steps=2, checkpoint=dict(monitor="val/loss"))


def test_checkpoint_monitor_not_logged_at_a_save_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, Regressor(), max_steps=4, log_every_n_steps=10,
                    checkpoint=dict(monitor="train/abs_error", every_n_steps=1, save_last=True))
    warned = [w for w in warnings_in(caplog) if "checkpoint.monitor=train/abs_error has no logged value" in w]
    assert len(warned) == 1 and "at step 1" in warned[0], warnings_in(caplog)


def test_save_on_signal_outside_the_main_thread_warns(tmp_path, caplog):
    import threading

    with caplog.at_level(logging.INFO, logger="trainer"):
        worker = threading.Thread(target=run_trainer, args=(tmp_path, Regressor()),
                                  kwargs=dict(max_steps=2, checkpoint=dict(save_on_signal=True)))
        worker.start()
        worker.join(120)
    assert [w for w in warnings_in(caplog) if "fit runs outside the main thread" in w], warnings_in(caplog)


class PipelineRegressorWithSteps(Regressor):
    def pipeline_layers(self):
        return list(self.net)

    def pipeline_loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1])


def test_pipeline_with_training_step_warns_that_pipeline_loss_replaces_it(tmp_path, caplog):
    from trainer.strategies.pipeline import PipelineStrategy

    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, PipelineRegressorWithSteps(), max_steps=1, batch_size=4,
                    strategy=PipelineStrategy(microbatches=2))
    warned = [w for w in warnings_in(caplog) if "pipeline_loss() on the last stage instead of" in w]
    assert len(warned) == 1 and "training_step() / validation_step()" in warned[0], warnings_in(caplog)
