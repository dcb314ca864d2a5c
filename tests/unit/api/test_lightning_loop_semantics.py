"""Lightning's loop semantics under ``trainer.lightning``, with Lightning itself as the oracle: the same
module (tests/support/lightning_loop_modules.py) run under both, comparing hook calls, logged values and
weights. Their 2-rank counterparts: tests/multiprocess/api/test_lightning_loop_ranks.py."""

from __future__ import annotations

import pytest
import torch

import trainer.lightning as ours
from tests.support.lightning_loop_modules import EvalStepSteps, SkipSteps, build, recorded_rows, recording_logger, run_call

pl = pytest.importorskip("lightning.pytorch")


def both(tmp_path, steps, module_args=None, call="fit", **flags):
    """(Lightning's (module, trainer, result), ours)."""
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build(package, steps)(**(module_args or {}))
        trainer, result = run_call(package, module, call, str(tmp_path / side), **flags)
        runs.append((module, trainer, result))
    return runs


def metrics(trainer):
    return {name: float(value) for name, value in trainer.callback_metrics.items()}


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
