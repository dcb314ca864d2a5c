"""Lightning's validation schedule and data reads under ``trainer.lightning``, with Lightning itself as
the oracle (the same module run under both, tests/support/lightning_schedule_modules.py): where
``val_check_interval`` / ``check_val_every_n_epoch`` validate, when ``val_dataloader()`` is read
without a sanity pass, ``overfit_batches``' data order, and Lightning's warnings about them. Their
2-rank counterparts: tests/multiprocess/api/test_lightning_val_schedule_ranks.py."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import SequentialSampler

import trainer.lightning as ours
from tests.support.lightning_loop_modules import build, run_call
from tests.support.lightning_schedule_modules import ScheduleSteps

pl = pytest.importorskip("lightning.pytorch")


def both(tmp_path, module_args=None, **flags):
    """(Lightning's (module, trainer), ours) after ``fit``."""
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build(package, ScheduleSteps)(**(module_args or {}))
        trainer, _ = run_call(package, module, "fit", str(tmp_path / side), **flags)
        runs.append((module, trainer))
    return runs


def validations(module):
    return [call for call in module.calls if call[0] in ("on_validation_epoch_end", "val_dataloader")]


@pytest.mark.parametrize("flags, expected_steps", [
    (dict(val_check_interval=3, max_epochs=2), [3, 6, 11, 14]),  # counted in each epoch of 8 steps
    (dict(val_check_interval=0.375, max_epochs=2), [3, 6, 11, 14]),  # 3 of 8: no extra one at the epoch end
    (dict(val_check_interval=0.5, max_epochs=2), [4, 8, 12, 16]),
    (dict(val_check_interval=1.0, max_epochs=2), [8, 16]),
    (dict(val_check_interval=3, check_val_every_n_epoch=2, max_epochs=3), [11, 14]),  # epoch 1 only
    (dict(val_check_interval=3, check_val_every_n_epoch=None, max_epochs=2), [3, 6, 9, 12, 15]),  # across epochs
    (dict(check_val_every_n_epoch=2, max_epochs=4), [16, 32]),
    (dict(val_check_interval=3, check_val_every_n_epoch=2, max_epochs=3, num_sanity_val_steps=2), [0, 11, 14]),
])
def test_validation_falls_where_lightnings_schedule_puts_it(tmp_path, flags, expected_steps):
    (pl_module, pl_trainer), (module, trainer) = both(tmp_path, **flags)
    assert module.calls == pl_module.calls  # every step, every validation and every val_dataloader() read
    assert [call[2] for call in module.calls if call[0] == "on_validation_epoch_end"] == expected_steps
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, rtol=1e-6, atol=1e-7)
    assert float(trainer.callback_metrics["v"]) == pytest.approx(float(pl_trainer.callback_metrics["v"]), rel=1e-6)


def test_a_stop_validates_only_in_an_epoch_that_validates(tmp_path):
    # Epochs of 8 steps, every 2nd epoch validates every 3 steps; a stop after step 13 (epoch 1) validates there.
    (pl_module, _), (module, trainer) = both(tmp_path, {"stop_at_step": 13}, val_check_interval=3,
                                             check_val_every_n_epoch=2, max_epochs=3)
    assert module.calls == pl_module.calls
    assert [call[2] for call in validations(module) if call[0] == "on_validation_epoch_end"] == [11, 13]
    assert trainer.current_epoch == 2


def test_an_interval_longer_than_an_epoch_counted_in_epochs_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="must be less than or equal to the number of the training batches"):
        run_call(ours, build(ours, ScheduleSteps)(), "fit", str(tmp_path), val_check_interval=9, max_epochs=1)
    trainer, _ = run_call(ours, build(ours, ScheduleSteps)(), "fit", str(tmp_path), val_check_interval=9,
                          max_epochs=1, limit_val_batches=0)  # (no validation: nothing to count)
    assert trainer.global_step == 8


@pytest.mark.parametrize("flags", [
    dict(check_val_every_n_epoch=2, max_epochs=4),
    dict(check_val_every_n_epoch=3, max_epochs=6, reload_dataloaders_every_n_epochs=4),
    dict(check_val_every_n_epoch=2, max_epochs=4, reload_dataloaders_every_n_epochs=1),
    dict(check_val_every_n_epoch=None, val_check_interval=12, max_epochs=2),
    dict(check_val_every_n_epoch=2, max_epochs=4, num_sanity_val_steps=2),  # the sanity pass reads it first
])
def test_val_dataloader_is_read_when_lightning_reads_it(tmp_path, flags):
    (pl_module, _), (module, _) = both(tmp_path, **flags)
    assert validations(module) == validations(pl_module)


def test_a_deferred_read_gives_the_data_an_early_read_gives(tmp_path):
    # Random validation data (drawn from the global generators in val_dataloader()): read at the first
    # validation (epoch 1) or before the sanity pass, it is the same data, so the same validation.
    results = {}
    for sanity in (0, 2):
        module = build(ours, ScheduleSteps)(random=True)
        trainer, _ = run_call(ours, module, "fit", str(tmp_path / str(sanity)), check_val_every_n_epoch=2,
                              max_epochs=2, num_sanity_val_steps=sanity)
        results[sanity] = (validations(module)[0], float(trainer.callback_metrics["v"]))
    assert results[0][0] == ("val_dataloader", 1, False) and results[2][0] == ("val_dataloader", 0, True)
    assert results[0][1] == results[2][1]


def test_lightnings_hooks_draw_the_same_random_data_after_its_sanity_pass(tmp_path):
    module = build(pl, ScheduleSteps)(random=True)
    run_call(pl, module, "fit", str(tmp_path), overfit_batches=1, max_epochs=2, num_sanity_val_steps=2)
    assert module.batches["train"][0] == module.batches["val"][0]


@pytest.mark.parametrize("sanity", [0, 2])
def test_training_and_validation_hooks_draw_the_same_random_data(tmp_path, sanity):
    # Both hooks build 16 random samples from the global generators: under overfit_batches=1 the one
    # training batch is the first validation batch (Lightning: where its sanity pass put the random
    # state back, the test above; here with or without one).
    module = build(ours, ScheduleSteps)(random=True)
    run_call(ours, module, "fit", str(tmp_path), overfit_batches=1, max_epochs=2, num_sanity_val_steps=sanity)
    assert module.batches["train"][0] == module.batches["val"][0]
    assert module.batches["train"] == [module.batches["train"][0]] * 2  # the same batch every epoch


def test_overfit_batches_reads_both_loaders_in_order_with_lightnings_warning(tmp_path):
    (pl_module, pl_trainer), _ = both(tmp_path, {"sampler": True}, overfit_batches=2, max_epochs=1)
    module = build(ours, ScheduleSteps)(sampler=True)
    trainer = ours.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_epochs=1,
                           default_root_dir=str(tmp_path / "warned"), overfit_batches=2, num_sanity_val_steps=0)
    with pytest.warns(UserWarning) as caught:
        trainer.fit(module)
    texts = [str(w.message) for w in caught]
    assert any("requested to overfit but enabled train dataloader shuffling" in t for t in texts)
    assert any("requested to overfit but enabled val dataloader shuffling" in t for t in texts)
    assert module.batches == pl_module.batches  # the first batches in dataset order, not the sampler's
    assert module.batches["train"][0] == pytest.approx([0.0, 0.1])
    for shown in (trainer.train_dataloader, trainer.val_dataloaders):
        assert isinstance(shown.sampler, SequentialSampler)
        assert next(iter(shown))[0][0].tolist() == pytest.approx([0.0, 0.1])
    assert isinstance(pl_trainer.train_dataloader.sampler, SequentialSampler)


def test_overfit_batches_leaves_sequential_loaders_and_validate_alone(tmp_path):
    module = build(ours, ScheduleSteps)()
    trainer = ours.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_epochs=1,
                           default_root_dir=str(tmp_path), overfit_batches=2, num_sanity_val_steps=0)
    reversed_module = build(ours, ScheduleSteps)(sampler=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)  # nothing to turn off, nothing said
        trainer.validate(reversed_module, verbose=False)  # (Lightning's rule applies to fit only)
    assert not [w for w in caught if "requested to overfit" in str(w.message)]
    assert reversed_module.batches["val"][0] == pytest.approx([0.8, 0.9])  # the sampler's order
    assert not isinstance(trainer.val_dataloaders.sampler, SequentialSampler)


@pytest.mark.parametrize("flags, batches", [(dict(limit_train_batches=1, log_every_n_steps=2), 1),
                                            (dict(log_every_n_steps=11, batch_size=16), 1),
                                            (dict(log_every_n_steps=9), 8)])
def test_an_epoch_shorter_than_the_logging_interval_is_warned_about(tmp_path, flags, batches):
    flags = dict(flags)
    module = build(ours, ScheduleSteps)(batch_size=flags.pop("batch_size", 2))
    trainer = ours.Trainer(logger=ours.loggers.CSVLogger(str(tmp_path)), enable_checkpointing=False,
                           enable_progress_bar=False, max_epochs=1, default_root_dir=str(tmp_path), **flags)
    with pytest.warns(UserWarning, match=rf"The number of training batches \({batches}\) is smaller than the logging "
                                         "interval"):
        trainer.fit(module)


@pytest.mark.parametrize("flags", [dict(fast_dev_run=True), dict(logger=False), dict(log_every_n_steps=8)])
def test_no_logging_interval_warning_without_a_logger_or_under_fast_dev_run(tmp_path, flags):
    settings = dict(logger=ours.loggers.CSVLogger(str(tmp_path)), log_every_n_steps=9)
    settings.update(flags)
    trainer = ours.Trainer(enable_checkpointing=False, enable_progress_bar=False, max_epochs=1,
                           default_root_dir=str(tmp_path), **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(build(ours, ScheduleSteps)())
    assert not [w for w in caught if "smaller than the logging interval" in str(w.message)]
