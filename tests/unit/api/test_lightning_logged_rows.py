"""What the loggers, ``trainer.logged_metrics`` and ``trainer.callback_metrics`` hold under
``trainer.lightning``, with Lightning itself as the oracle: the rows the module logged (``epoch`` added,
at Lightning's steps, called as ``log_metrics(metrics=..., step=...)``), not this trainer's own values,
which stay in ``metrics.jsonl``; a name logged per step and again at the epoch end; the results of
several test loaders. The 2-rank counterpart: tests/multiprocess/api/test_lightning_loop_ranks.py."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest
import torch

import trainer.lightning as ours
from tests.support.lightning_loop_modules import (AddIndexOrNotSteps, EpochEndAgainSteps, EvalStepSteps, ModuleSteps, build,
                                                  recording_logger, run_call)

pl = pytest.importorskip("lightning.pytorch")


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_the_loggers_rows_and_the_trainers_metrics_are_lightnings(tmp_path):
    seen = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        path = str(tmp_path / f"{side}.jsonl")
        module = build(package, EvalStepSteps)()
        trainer, _ = run_call(package, module, "fit", str(tmp_path / side), max_epochs=2,
                              logger=recording_logger(package, path))
        fitted = (dict(trainer.logged_metrics), dict(trainer.callback_metrics))
        trainer.validate(module, verbose=False)
        trainer.test(module, verbose=False)
        seen[side] = (_rows(path), fitted, dict(trainer.logged_metrics), dict(trainer.callback_metrics))
    (pl_rows, pl_fitted, pl_logged, pl_shown), (rows, fitted, logged, shown) = seen.values()
    # training rows at steps 0..7, the epoch ends and validations at their last batch's step, then
    # validate / test at the batches trained; each row with the epoch
    assert [(row["step"], sorted(row)) for row in rows] == [(row["step"], sorted(row)) for row in pl_rows]
    assert rows == [pytest.approx(row, rel=1e-6) for row in pl_rows]
    for ours_, theirs in ((fitted[0], pl_fitted[0]), (fitted[1], pl_fitted[1]), (logged, pl_logged), (shown, pl_shown)):
        assert set(ours_) == set(theirs)  # no train/loss, perf/..., memory/..., epoch
        assert all(isinstance(value, torch.Tensor) for value in ours_.values())
        assert {k: float(v) for k, v in ours_.items()} == pytest.approx({k: float(v) for k, v in theirs.items()},
                                                                         rel=1e-6)


def test_log_metrics_is_called_with_keywords_and_nothing_is_written_for_an_empty_row(tmp_path):
    class StartOnly(ModuleSteps):
        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def on_train_start(self):
            self.log("foo", 123)

    calls = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        with mock.patch.object(package.loggers.CSVLogger, "log_metrics") as log_metrics:
            run_call(package, build(package, StartOnly)(batch_size=16), "fit", str(tmp_path / side), max_epochs=2,
                     limit_val_batches=0, logger=package.loggers.CSVLogger(str(tmp_path / side)))
        calls[side] = log_metrics.mock_calls
    assert calls["ours"] == calls["lightning"] == [mock.call(metrics={"foo": 123.0, "epoch": 0}, step=0)]


def test_the_trainers_own_values_stay_in_metrics_jsonl(tmp_path):
    module = build(ours, ModuleSteps)()
    trainer, _ = run_call(ours, module, "fit", str(tmp_path), max_epochs=1,
                          logger=ours.loggers.CSVLogger(str(tmp_path)))
    record = _rows(os.path.join(trainer.log_dir, "metrics.jsonl"))
    assert [row["step"] for row in record if "l_step" in row] == [1, 2, 3, 4]  # (this trainer's step axis)
    assert any("perf/samples_per_s" in row for row in record) and any("train/loss" in row for row in record)
    assert not any(name.startswith(("perf/", "train/", "memory/")) for name in trainer.callback_metrics)


def test_our_trainer_keeps_its_own_values(tmp_path):
    from trainer import Trainer

    module = build(ours, ModuleSteps)()
    trainer = Trainer(max_steps=2, log_every_n_steps=1, run_dir=str(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      limit_val_batches=0)
    trainer.fit(module)
    assert "train/loss" in trainer.logged_metrics and "l_step" in trainer.logged_metrics
    assert isinstance(trainer.logged_metrics["l_step"], float)


def test_a_name_logged_per_step_and_again_at_the_epoch_end(tmp_path):
    shown = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        trainer, _ = run_call(package, build(package, EpochEndAgainSteps)(), "fit", str(tmp_path / side), max_epochs=2,
                              limit_val_batches=0)
        shown[side] = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert shown["ours"] == pytest.approx(shown["lightning"], rel=1e-6)
    assert shown["ours"]["shared"] == 111.0


def test_the_results_of_several_test_loaders_hold_what_each_loader_logged(tmp_path):
    results = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        _, results[side] = run_call(package, build(package, AddIndexOrNotSteps)(), "test", str(tmp_path / side))
    assert results["ours"] == results["lightning"]
    assert set(results["ours"][0]) == {"common/dataloader_idx_0", "only_0", "a", "e"}
