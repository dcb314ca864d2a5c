"""The seams between runs and calls: extending a finished run, validating a checkpoint,
what the caller of a spawned fit gets back, re-seeding on another world size, and how a worker's
error reaches the user.

Equality of an extended run with one uninterrupted run is bitwise (same world size, dropout on:
the random generators are part of what must continue)."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from functools import partial

import pytest
import torch
from torch import nn

from tests.support.helpers import REPO, BlockRegressor, CheckpointedRegressor, Regressor, fit, read_metrics, run_trainer
from trainer import Trainer
from trainer.checkpoint import layout
from trainer.runtime.seeding import derive_seed
from trainer.optim.schedules import warmup_cosine
from trainer.strategies import resolve_strategy

pytestmark = pytest.mark.timeout(300)

# 200 samples, global batch 16: 13 steps per epoch. The first run stops mid-epoch 0 at step 5;
# the extension runs to step 16, across the boundary into epoch 1.
FIRST, FINAL = 5, 16
LAYOUTS = {
    "single": dict(strategy="single", devices=1, batch_size=16),
    "ddp": dict(strategy="ddp", devices=2, batch_size=8),
}
SAVE_LAST = dict(checkpoint=dict(save_last=True))


class EpochEndRecorder(CheckpointedRegressor):
    """Appends the epoch of every ``on_train_epoch_end`` to ``<run_dir>/epoch_ends.txt`` (rank 0)."""

    def on_train_epoch_end(self, epoch):
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            with open(os.path.join(self.trainer.run_dir, "epoch_ends.txt"), "a") as f:
                f.write(f"{epoch}\n")


def epoch_ends(run_dir):
    path = os.path.join(str(run_dir), "epoch_ends.txt")
    return [int(line) for line in open(path)] if os.path.exists(path) else []


def step_losses(run_dir):
    return {r["step"]: r["train/loss"] for r in read_metrics(str(run_dir)) if "train/loss" in r}


def progress_of(checkpoint):
    with open(os.path.join(checkpoint, "trainer_state.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def stopped_mid_epoch(tmp_path_factory):
    """Per layout: a run that stopped at max_steps=FIRST, in the middle of epoch 0."""
    made = {}

    def make(name):
        if name not in made:
            run_dir = tmp_path_factory.mktemp(f"first_{name}")
            fit(run_dir, EpochEndRecorder(), **LAYOUTS[name], **SAVE_LAST, max_steps=FIRST)
            made[name] = run_dir
        return made[name]
    return make


# ----- 1: extending a finished run ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["single", "ddp"])
def test_extended_run_equals_one_uninterrupted_run(tmp_path, stopped_mid_epoch, name):
    first = stopped_mid_epoch(name)
    assert epoch_ends(first) == []  # epoch 0 did not end
    latest = layout.find_latest(str(first / "checkpoints"))
    assert (progress_of(latest)["epoch"], progress_of(latest)["epoch_step"]) == (0, FIRST)
    run_dir = tmp_path / "extended"
    shutil.copytree(first, run_dir)  # the finished run, extended in place
    _, params = fit(run_dir, EpochEndRecorder(), **LAYOUTS[name], **SAVE_LAST, max_steps=FINAL, resume="auto")
    ref_losses, ref_params = fit(tmp_path / "whole", EpochEndRecorder(), **LAYOUTS[name], **SAVE_LAST, max_steps=FINAL)
    losses = step_losses(run_dir)
    assert [losses[s] for s in range(1, FINAL + 1)] == ref_losses
    for key, value in ref_params.items():
        assert torch.equal(params[key], value), key
    assert epoch_ends(run_dir) == epoch_ends(tmp_path / "whole") == [0]


class ScheduledRegressor(CheckpointedRegressor):
    """warmup_cosine over ``total_steps`` (the config group ties it to trainer.max_steps)."""

    def __init__(self, total_steps):
        super().__init__()
        self.scheduler_factory = partial(warmup_cosine, warmup_steps=2, total_steps=total_steps)


def test_schedule_tied_to_max_steps_warns_once_on_extension(tmp_path, caplog):
    args = dict(LAYOUTS["single"], checkpoint=dict(save_last=True))
    fit(tmp_path, ScheduledRegressor(total_steps=FIRST), max_steps=FIRST, **args)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        fit(tmp_path, ScheduledRegressor(total_steps=FINAL), max_steps=FINAL, resume="auto", **args)
    warnings = [r.getMessage() for r in caplog.records if "schedule changed length" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"{FIRST} steps in the checkpoint's run" in warnings[0] and f"{FINAL} steps now" in warnings[0]
    assert sorted(step_losses(tmp_path)) == list(range(1, FINAL + 1))


def test_a_resume_where_the_limits_already_end_the_run_says_so(tmp_path, caplog):
    args = dict(LAYOUTS["single"], **SAVE_LAST)
    fit(tmp_path, Regressor(), max_steps=FIRST, **args)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        fit(tmp_path, Regressor(), max_steps=FIRST, resume="auto", **args)  # nothing left to train
    said = [r.getMessage() for r in caplog.records if "already end it: nothing is trained" in r.getMessage()]
    assert len(said) == 1 and f"resumed at step {FIRST}" in said[0] and f"trainer.max_steps={FIRST}" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        fit(tmp_path, Regressor(), max_steps=FINAL, resume="auto", **args)  # extended: it trains on, unwarned
    assert not [r for r in caplog.records if "nothing is trained" in r.getMessage()]
    assert sorted(step_losses(tmp_path)) == list(range(1, FINAL + 1))


# ----- 6: validate(ckpt) --------------------------------------------------------------------------------
def test_validate_loads_the_checkpoint(tmp_path):
    fit(tmp_path, Regressor(val_samples=40), max_steps=6, checkpoint=dict(save_last=True))
    trained = [r for r in read_metrics(str(tmp_path)) if "val/loss" in r][-1]["val/loss"]
    checkpoint = layout.find_latest(str(tmp_path / "checkpoints"))
    common = dict(loggers=["jsonl"], progress_bar=False)
    by_resume = Trainer(resume=checkpoint, run_dir=str(tmp_path / "v1"), **common).validate(Regressor(val_samples=40))
    assert by_resume["val/loss"] == pytest.approx(trained, rel=1e-6)
    trainer = Trainer(run_dir=str(tmp_path), **common)
    assert trainer.validate(Regressor(val_samples=40), ckpt_path="last")["val/loss"] == pytest.approx(trained, rel=1e-6)
    untrained = Trainer(run_dir=str(tmp_path / "v2"), **common).validate(Regressor(val_samples=40))
    assert untrained["val/loss"] != pytest.approx(trained, rel=1e-3)


def test_validate_best_checkpoint(tmp_path):
    fit(tmp_path, Regressor(val_samples=40), max_steps=6, val_every_n_steps=2,
        checkpoint=dict(every_n_steps=2, keep_last=None, monitor="val/loss"))
    best = min(r["val/loss"] for r in read_metrics(str(tmp_path)) if "val/loss" in r)
    trainer = Trainer(run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False,
                      checkpoint=dict(monitor="val/loss"))
    assert trainer.validate(Regressor(val_samples=40), ckpt_path="best")["val/loss"] == pytest.approx(best, rel=1e-6)


def test_ckpt_path_and_resume_that_differ_are_refused(tmp_path):
    fit(tmp_path, Regressor(), max_steps=2, checkpoint=dict(save_last=True))
    checkpoint = layout.find_latest(str(tmp_path / "checkpoints"))
    trainer = Trainer(resume=checkpoint, run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False)
    with pytest.raises(ValueError, match=r"ckpt_path='last' and trainer.resume=.* name different checkpoints"):
        trainer.validate(Regressor(), ckpt_path="last")
    with pytest.raises(ValueError, match=r"ckpt_path='best' needs checkpoint.monitor"):
        Trainer(run_dir=str(tmp_path), loggers=["jsonl"], checkpoint=dict(save_last=True)).fit(Regressor(), ckpt_path="best")
    with pytest.raises(ValueError, match=r"ckpt_path='nowhere' does not exist"):
        Trainer(run_dir=str(tmp_path), loggers=["jsonl"]).validate(Regressor(), ckpt_path="nowhere")


# ----- 7: what the caller of fit gets back ----------------------------------------------------------------
class NormedBlockRegressor(BlockRegressor):
    """Layers built in configure_model, with a BatchNorm (buffers that training changes)."""

    def configure_model(self):
        super().configure_model()
        self.norm = nn.BatchNorm1d(6)

    def forward(self, x):
        return super().forward(self.norm(x))

    def pipeline_layers(self):
        return [self.norm, *super().pipeline_layers()]


SPAWNED = {
    "ddp": dict(strategy="ddp", devices=2, batch_size=8),
    "zero1": dict(strategy=resolve_strategy("ddp", zero1=True), devices=2, batch_size=8),
    "fsdp": dict(strategy="fsdp", devices=2, batch_size=8),
    "pipeline": dict(strategy=resolve_strategy("pipeline", schedule="1f1b", microbatches=2), devices=2, batch_size=16),
}


@pytest.mark.parametrize("name", list(SPAWNED))
def test_spawned_fit_leaves_the_trained_model_in_the_caller(tmp_path, name):
    module = NormedBlockRegressor()
    args = dict(max_steps=4, log_every_n_steps=1, loggers=["jsonl"], progress_bar=False, collective_timeout_s=120,
                run_dir=str(tmp_path))
    trainer = Trainer(**SPAWNED[name], **args)
    trainer.fit(module)
    trained = torch.load(tmp_path / "params.pt")  # rank 0's full state dict at on_fit_end
    state = module.state_dict()
    assert set(state) == set(trained) and any("running_mean" in k for k in trained)
    for key, value in trained.items():
        assert torch.equal(state[key], value), key
    assert not torch.equal(trained["norm.running_mean"], torch.zeros(6))  # buffers were trained
    assert (trainer.global_step, trainer.current_epoch) == (4, 0)
    assert trainer.logged_metrics["train/loss"] == read_metrics(str(tmp_path))[-1]["train/loss"]
    assert not os.path.exists(tmp_path / ".fit_result.pt")


def test_opt_out_keeps_initial_weights_and_validate_needs_a_checkpoint(tmp_path):
    module = Regressor(val_samples=16)
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = Trainer(strategy="ddp", devices=2, batch_size=8, max_steps=2, return_weights=False, loggers=["jsonl"],
                      progress_bar=False, run_dir=str(tmp_path), checkpoint=dict(save_last=True))
    trainer.fit(module)
    assert all(torch.equal(v, initial[k]) for k, v in module.state_dict().items())
    assert trainer.global_step == 2
    with pytest.raises(ValueError, match=r'return_weights=false.*ckpt_path="last"'):
        trainer.validate(module)


def test_in_process_fit_sets_progress_on_the_trainer(tmp_path):
    trainer = Trainer(max_steps=3, batch_size=16, log_every_n_steps=1, loggers=["jsonl"], progress_bar=False,
                      run_dir=str(tmp_path))
    returned = trainer.fit(Regressor())
    assert (trainer.global_step, trainer.current_epoch) == (3, 0)
    assert trainer.logged_metrics == returned
    # callback_metrics: the same without the loggers' epoch axis (as Lightning's)
    assert trainer.callback_metrics == {k: v for k, v in returned.items() if k != "epoch"}
    assert "return_weights" in open(os.path.join(REPO, "conf", "trainer", "default.yaml")).read()


# ----- 17: resuming on another world size re-seeds ----------------------------------------------------------
class DrawsAtStart(CheckpointedRegressor):
    def on_fit_start(self):
        torch.save(torch.rand(4), os.path.join(self.trainer.run_dir, "draw.pt"))


def test_resume_on_another_world_size_reseeds_and_says_so(tmp_path, stopped_mid_epoch, caplog):
    checkpoint = layout.find_latest(str(stopped_mid_epoch("ddp") / "checkpoints"))
    with caplog.at_level(logging.INFO, logger="trainer"):
        run_trainer(tmp_path, DrawsAtStart(), **LAYOUTS["single"], max_steps=FIRST + 1, resume=checkpoint)
    torch.manual_seed(derive_seed(0, "resume", FIRST, 0))  # the log's claim, checked first
    assert torch.equal(torch.load(tmp_path / "draw.pt"), torch.rand(4))
    lines = [r.getMessage() for r in caplog.records if "re-seeded" in r.getMessage()]
    assert lines == [f"resuming a 2-rank checkpoint on 1 ranks: random generators re-seeded from (seed 0, step {FIRST}, "
                     "rank), not restored"]


# ----- E: a worker's error, as the user sees it ----------------------------------------------------------------
class RaisesOnRankOne(Regressor):
    def training_step(self, batch, batch_idx):
        if torch.distributed.get_rank() == 1 and batch_idx == 1:
            raise ValueError("boom from the user's training_step")
        return super().training_step(batch, batch_idx)


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from tests.unit.loop.test_consecutive_calls import RaisesOnRankOne
from trainer import Trainer

if __name__ == "__main__":
    Trainer(strategy="ddp", devices=2, batch_size=8, max_steps=4, loggers=["jsonl"], progress_bar=False,
            run_dir={run_dir!r}, collective_timeout_s=60).fit(RaisesOnRankOne())
"""


def test_worker_error_shows_the_users_traceback_once_with_its_rank(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(SCRIPT.format(tests=REPO, run_dir=str(tmp_path / "run")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode != 0
    err = done.stderr
    user_frames = re.findall(r'test_consecutive_calls\.py", line \d+, in training_step', err)
    assert len(user_frames) == 1, err
    assert "rank 1 (pid" in err and "WorkerFailed: rank 1 failed: ValueError: boom from the user's training_step" in err, err
    assert err.count("Traceback (most recent call last)") <= 2, err  # the user's, and the launcher's own
