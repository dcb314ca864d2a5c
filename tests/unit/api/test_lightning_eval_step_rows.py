"""What evaluation batches log under ``trainer.lightning``, with Lightning itself as the oracle: the rows
of ``self.log(..., on_step=True)`` in validation and test (a list of one loader is one loader: no
``dataloader_idx``, no ``/dataloader_idx_0``; each of several loaders counts its batches from 0, every
batch counting, logged or not; fit's passes count on until ``val_dataloader()`` is read again), the
progress bar's share of them, and the TensorBoard logger's ``hp_metric`` row. The 2-rank counterpart:
tests/multiprocess/api/test_lightning_eval_rows_ranks.py."""

from __future__ import annotations

from unittest import mock

import pytest

import trainer.lightning as ours
from tests.support.lightning_eval_rows_modules import HparamsSteps, LoadersStepSteps, step_logs_in_hooks
from tests.support.lightning_loop_modules import ModuleSteps, build, callback_numbers, recorded_rows, recording_logger, run_call

pl = pytest.importorskip("lightning.pytorch")

NAMES = tuple(f"{name}{suffix}" for name in ("vstep", "vboth_step", "tstep")
              for suffix in ("", "/dataloader_idx_0", "/dataloader_idx_1"))


def _eval_rows(tmp_path, module_args, **flags):
    """{side: (rows, the steps' (hook, batch_idx, dataloader_idx) calls, logged_metrics, progress_bar_metrics)}
    of fit (2 epochs), validate and test."""
    seen = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        path = str(tmp_path / f"{side}.jsonl")
        module = build(package, LoadersStepSteps)(**module_args)
        trainer, _ = run_call(package, module, "fit", str(tmp_path / side), max_epochs=2,
                              logger=recording_logger(package, path), **flags)
        trainer.validate(module, verbose=False)
        trainer.test(module, verbose=False)
        calls = [call for call in module.calls if call[0] in ("validation_step", "test_step")]
        logged = {k: float(v) for k, v in trainer.logged_metrics.items()}
        seen[side] = (recorded_rows(path, NAMES), calls, logged, dict(trainer.progress_bar_metrics))
    return seen


@pytest.mark.parametrize("module_args", [dict(single=True), dict(loaders=1), dict(loaders=2)],
                         ids=["a loader", "a list of one", "a list of two"])
def test_evaluation_rows_per_loader_are_lightnings(tmp_path, module_args):
    seen = _eval_rows(tmp_path, module_args)
    (pl_rows, pl_calls, pl_logged, _), (rows, calls, logged, _) = seen["lightning"], seen["ours"]
    assert calls == pl_calls  # (one loader, listed or not: no dataloader_idx passed)
    assert [sorted(row) for row in rows] == [sorted(row) for row in pl_rows]
    assert rows == [pytest.approx(row, rel=1e-6) for row in pl_rows]
    assert logged == pytest.approx(pl_logged, rel=1e-6)
    # each loader counts its own batches (epoch 1's first batches log nothing: no row, but counted)
    if module_args.get("loaders") == 2:
        assert [row["step"] for row in rows if "vstep/dataloader_idx_1" in row] == [0, 1, 3, 0, 1]
    else:
        assert not any("dataloader_idx" in name for row in rows for name in row)
        assert [row["step"] for row in rows if "vstep" in row] == [0, 1, 2, 4, 5, 0, 1, 2]


def test_loaders_read_again_count_their_rows_from_zero(tmp_path):
    seen = _eval_rows(tmp_path, dict(loaders=2), reload_dataloaders_every_n_epochs=1)
    (pl_rows, *_), (rows, *_) = seen["lightning"], seen["ours"]
    assert rows == [pytest.approx(row, rel=1e-6) for row in pl_rows]
    assert [row["step"] for row in rows if "vstep/dataloader_idx_0" in row] == [0, 1, 2, 1, 2, 0, 1, 2]


def test_the_progress_bar_holds_what_a_callback_logs_in_validation_batches(tmp_path):
    seen = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        trainer, _ = run_call(package, build(package, ModuleSteps)(), "fit", str(tmp_path / side), max_epochs=1,
                              limit_val_batches=2, callbacks=[step_logs_in_hooks(package)],
                              logger=package.loggers.CSVLogger(str(tmp_path / side)))
        seen[side] = (callback_numbers(trainer), dict(trainer.progress_bar_metrics),
                      {k: float(v) for k, v in trainer.logged_metrics.items()})
    (pl_shown, pl_bar, pl_logged), (shown, bar, logged) = seen["lightning"], seen["ours"]
    assert shown == pytest.approx(pl_shown, rel=1e-6)
    # the last batch's on_step values too (callback_metrics lacks them), logger=False ones included
    assert bar == pytest.approx(pl_bar, rel=1e-6)
    assert {"batch_end_10", "batch_end_11", "batch_end_14_step", "batch_end_15_step"} <= set(bar)
    assert logged == pytest.approx(pl_logged, rel=1e-6) and "batch_end_10" not in logged


def test_the_tensorboard_loggers_hp_metric_has_no_step(tmp_path):
    calls = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        with mock.patch.object(package.loggers.TensorBoardLogger, "log_metrics") as log_metrics:
            run_call(package, build(package, HparamsSteps)(), "fit", str(tmp_path / side), max_epochs=1,
                     limit_val_batches=0, logger=package.loggers.TensorBoardLogger(str(tmp_path / side)))
        calls[side] = log_metrics.mock_calls
    assert calls["ours"][0] == calls["lightning"][0] == mock.call({"hp_metric": -1}, None)
    assert [(call.args, sorted(call.kwargs.get("metrics", {})), call.kwargs.get("step")) for call in calls["ours"]] == \
           [(call.args, sorted(call.kwargs.get("metrics", {})), call.kwargs.get("step")) for call in calls["lightning"]]


def test_a_first_pass_that_starts_logging_per_batch_late_writes_no_rows_and_says_so(tmp_path, caplog):
    # (Lightning writes rows from the second batch; here the ranks agree at a pass's first batch whether it
    # writes per-batch rows: a row of docs/lightning.md)
    rows = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        path = str(tmp_path / f"{side}.jsonl")
        run_call(package, build(package, LoadersStepSteps)(single=True, late=True), "fit", str(tmp_path / side),
                 max_epochs=2, logger=recording_logger(package, path))
        rows[side] = recorded_rows(path, ("vstep", "vboth_step", "vboth_epoch"))
    assert [row["step"] for row in rows["lightning"] if "vstep" in row] == [1, 2, 4, 5]
    assert [row["step"] for row in rows["ours"] if "vstep" in row] == [4, 5]  # epoch 1's pass only
    assert any("first called after its first batch" in record.getMessage() for record in caplog.records)
    # the rows written and the passes' aggregates are Lightning's (nothing of the first pass leaks into them)
    expected = [row for row in rows["lightning"] if row["step"] >= 3 or "vboth_epoch" in row]
    assert rows["ours"] == [pytest.approx(row, rel=1e-6) for row in expected]
