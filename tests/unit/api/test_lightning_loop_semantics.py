"""Lightning's loop semantics under ``trainer.lightning``, with Lightning itself as the oracle: the same
module (tests/support/lightning_loop_modules.py) run under both, comparing hook calls, logged values and
weights. Their 2-rank counterparts: tests/multiprocess/api/test_lightning_loop_ranks.py."""

from __future__ import annotations

import pytest
import torch

import trainer.lightning as ours
from tests.support.lightning_loop_modules import EvalStepSteps, ManualSkipSteps, ModuleSteps, SeveralLoadersSteps, SkipSteps, build, callback_numbers, recorded_rows, recording_logger, run_both, run_call

pl = pytest.importorskip("lightning.pytorch")


def both(tmp_path, steps, module_args=None, call="fit", **flags):
    """[(module, trainer, result) under Lightning, the same under trainer.lightning]."""
    return run_both(pl, build, tmp_path, steps, module_args, call, **flags)


metrics = callback_numbers


@pytest.mark.parametrize("skip_sample, accumulate", [(6, 1), (0, 1), (15, 1), (6, 2)])
def test_on_train_batch_start_minus_one_skips_the_rest_of_the_epoch(tmp_path, skip_sample, accumulate):
    (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, SkipSteps, {"skip_sample": skip_sample},
                                                            max_epochs=2, accumulate_grad_batches=accumulate)
    assert module.calls == pl_module.calls  # the skipped batch's hook, no step, the epoch end, no validation
    # (with accumulation the step whose second micro-batch returned -1 is not taken either)
    assert trainer.global_step == pl_trainer.global_step == (4 + skip_sample // 4) // accumulate
    assert trainer.current_epoch == pl_trainer.current_epoch == 2
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, rtol=1e-6, atol=1e-7)
    # (with accumulation a step value is the global batch's mean here, the last micro-batch's in Lightning)
    expected = {k: v for k, v in metrics(pl_trainer).items() if accumulate == 1 or k != "l_step"}
    assert {k: v for k, v in metrics(trainer).items() if k in expected} == pytest.approx(expected, rel=1e-6)


def test_minus_one_under_manual_optimization_skips_as_lightning(tmp_path):
    (pl_module, pl_trainer, _), (module, trainer, _) = both(tmp_path, ManualSkipSteps, {"skip_sample": 6},
                                                            max_epochs=2)
    assert module.calls == pl_module.calls
    assert trainer.global_step == pl_trainer.global_step == 5
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, rtol=1e-6, atol=1e-7)


def test_callbacks_returning_minus_one_are_not_read(tmp_path):
    class MinusOne(ours.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            return -1

    trainer, _ = run_call(ours, build(ours, SkipSteps)(skip_sample=99), "fit", str(tmp_path), max_epochs=1,
                          callbacks=[MinusOne()])
    assert trainer.global_step == 4  # as Lightning: only the module's return value counts


def test_on_step_values_in_validation_and_test_are_written_per_batch_as_lightning(tmp_path):
    rows = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        path = str(tmp_path / f"{side}.jsonl")
        module = build(package, EvalStepSteps)()
        trainer, _ = run_call(package, module, "fit", str(tmp_path / side), max_epochs=2,
                              logger=recording_logger(package, path))
        validated = trainer.validate(module, verbose=False)
        tested = trainer.test(module, verbose=False)
        rows[side] = (recorded_rows(path, ("vs_step", "vo", "ts_step")), validated, tested,
                      metrics(trainer))
    (pl_rows, pl_validated, pl_tested, pl_metrics), (our_rows, validated, tested, our_metrics) = rows.values()
    # three batches per pass: fit's two passes count on (0..5), validate and test start again at 0
    assert [row["step"] for row in our_rows] == [row["step"] for row in pl_rows] == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2]
    assert our_rows == [pytest.approx(row, rel=1e-6) for row in pl_rows]
    assert validated[0] == pytest.approx(pl_validated[0], rel=1e-6) and set(validated[0]) == {"vs_epoch"}
    assert tested[0] == pytest.approx(pl_tested[0], rel=1e-6) and set(tested[0]) == {"ts_epoch"}
    assert {k: v for k, v in our_metrics.items() if k in pl_metrics} == pytest.approx(pl_metrics, rel=1e-6)


def _same_run(pl_run, our_run):
    (pl_module, pl_trainer, _), (module, trainer, _) = pl_run, our_run
    assert module.calls == pl_module.calls
    assert (trainer.global_step, trainer.current_epoch) == (pl_trainer.global_step, pl_trainer.current_epoch)
    expected = metrics(pl_trainer)
    assert {k: v for k, v in metrics(trainer).items() if k in expected} == pytest.approx(expected, rel=1e-6)
    assert set(expected) <= set(metrics(trainer))
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("stop_at_step", [2, 4])
def test_a_stop_mid_epoch_ends_the_epoch_as_lightning(tmp_path, stop_at_step):
    # Step 2: in the middle of epoch 0 (validation, the epoch's hooks and l_epoch, then the end); step 4:
    # at the end of epoch 0.
    _same_run(*both(tmp_path, ModuleSteps, {"stop_at_step": stop_at_step}, max_epochs=3))


def _callback(package, name, **arguments):
    return getattr(package.callbacks, name)(**arguments)


@pytest.mark.parametrize("name, arguments, epochs", [
    # the first check sets the best; the second sees no improvement by min_delta
    ("EarlyStopping", dict(monitor="l_epoch", check_on_train_epoch_end=True, patience=1, min_delta=10.0), 2),
    ("EarlyStopping", dict(monitor="v", divergence_threshold=-10.0), 1),
    ("EarlyStopping", dict(monitor="v", stopping_threshold=10.0), 1),
    ("EarlyStopping", dict(monitor="missing", strict=False), 3),
    ("Timer", dict(duration={"microseconds": 1}, interval="epoch"), 1),
])
def test_early_stopping_and_timer_settings_stop_as_lightning(tmp_path, name, arguments, epochs, caplog):
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build(package, ModuleSteps)()
        trainer, _ = run_call(package, module, "fit", str(tmp_path / side), max_epochs=3,
                              callbacks=[_callback(package, name, **arguments)])
        runs.append((module, trainer, None))
    _same_run(*runs)
    assert runs[1][1].current_epoch == epochs
    if arguments.get("strict") is False:
        assert "EarlyStopping(monitor='missing')" in caplog.text


@pytest.mark.parametrize("as_dict", [False, True])
def test_several_test_and_predict_loaders_run_as_lightning(tmp_path, as_dict):
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build(package, SeveralLoadersSteps)(as_dict=as_dict)
        trainer, predicted = run_call(package, module, "predict", str(tmp_path / side))
        tested = trainer.test(module, verbose=False)
        runs.append((module, tested, predicted))
    (pl_module, pl_tested, pl_predicted), (module, tested, predicted) = runs
    assert module.calls == pl_module.calls  # each loader in turn, dataloader_idx in the steps and hooks
    assert [set(d) for d in tested] == [{"t/dataloader_idx_0", "e"}, {"t/dataloader_idx_1", "e"}]
    assert tested == [pytest.approx(d, rel=1e-6) for d in pl_tested]
    assert [len(loader) for loader in predicted] == [len(loader) for loader in pl_predicted] == [3, 2]
    for ours_loader, pl_loader in zip(predicted, pl_predicted):
        torch.testing.assert_close(torch.cat(ours_loader), torch.cat(pl_loader))
