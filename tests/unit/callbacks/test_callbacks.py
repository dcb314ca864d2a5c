"""Callbacks: hook order, stopping every rank at the same step (EarlyStopping, Timer), the learning
rate monitor, checkpointed callback state, Hydra composition and ``train.py`` with callbacks.

Multi-process runs use the trainer's own spawn (2 ranks, gloo on 127.0.0.1) with a short
collective timeout and a pytest timeout, so a rank left behind fails the test instead of hanging.
The callbacks used by spawned workers are defined at module level here (workers unpickle them).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import timedelta
from functools import partial

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.support.helpers import REPO, Regressor, read_metrics, run_trainer
from trainer import Trainer
from trainer.api.run_view import RunView
from trainer.callbacks import Callback, EarlyStopping, LearningRateMonitor, Timer, parse_duration, run_of
from trainer.cli.hydra_app import build
from trainer.runtime.launch import WorkerFailed
from trainer.optim.schedules import warmup_cosine

pytestmark = pytest.mark.timeout(240)
DDP = dict(strategy="ddp", devices=2, batch_size=4, collective_timeout_s=60)


# ----- callbacks and modules (importable by spawned workers) ---------------------------------------------
class StopRecorder(Callback):
    """Each rank writes the step it ended at, and the stop request it saw, into the run dir."""

    def on_fit_end(self, trainer, module):
        run = run_of(trainer)
        with open(os.path.join(run.run_dir, f"stopped_rank{run.rank}.json"), "w") as f:
            json.dump({"step": run.step, "stop": run.stop_request}, f)


class SkewedTimer(Timer):
    """A Timer whose clock runs over on rank 1 only, from ``late_step`` on: the ranks disagree."""

    def __init__(self, late_step: int, **kwargs):
        super().__init__(**kwargs)
        self.late_step = late_step
        self.step = 0

    def on_train_step_end(self, trainer, module, step, metrics):
        self.step = step
        super().on_train_step_end(trainer, module, step, metrics)

    def elapsed(self):
        late = self.step >= self.late_step and torch.distributed.get_rank() == 1
        return self.max_time_s + 1.0 if late else 0.0


class HookRecorder(Callback):
    """Appends ("callback", hook, argument) to a shared list; may request a stop at one step."""

    def __init__(self, calls: list, stop_at: int | None = None):
        self.calls, self.stop_at = calls, stop_at

    def on_fit_start(self, trainer, module):
        self.calls.append(("callback", "on_fit_start", None))

    def on_train_step_end(self, trainer, module, step, metrics):
        self.calls.append(("callback", "on_train_step_end", (step, metrics is not None)))
        if step == self.stop_at:
            run_of(trainer).request_stop("asked by the test")

    def on_validation_end(self, trainer, module, metrics):
        self.calls.append(("callback", "on_validation_end", run_of(trainer).step))

    def on_train_epoch_end(self, trainer, module):
        self.calls.append(("callback", "on_train_epoch_end", run_of(trainer).epoch))

    def on_fit_end(self, trainer, module):
        self.calls.append(("callback", "on_fit_end", run_of(trainer).step))


class HookOrderRegressor(Regressor):
    """Records its own notification hooks in the same list as ``HookRecorder``."""

    def __init__(self, calls: list, **kwargs):
        super().__init__(**kwargs)
        self.calls = calls

    def on_fit_start(self):
        self.calls.append(("module", "on_fit_start", None))

    def on_train_step_end(self, step, metrics):
        self.calls.append(("module", "on_train_step_end", (step, metrics is not None)))

    def on_validation_end(self, metrics):
        self.calls.append(("module", "on_validation_end", self.trainer_step()))

    def trainer_step(self):
        # The step the last on_train_step_end saw (the module has no run object).
        return max((c[2][0] for c in self.calls if c[1] == "on_train_step_end"), default=0)

    def on_train_epoch_end(self, epoch):
        self.calls.append(("module", "on_train_epoch_end", epoch))

    def on_fit_end(self):
        self.calls.append(("module", "on_fit_end", self.trainer_step()))


class TwoGroupRegressor(Regressor):
    """Two parameter groups with different learning rates, and a warm-up + cosine schedule."""

    def configure_optimizers(self):
        optimizer = two_group_sgd(self.net)
        return optimizer, schedule(optimizer)


def two_group_sgd(net):
    return torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.05},
                            {"params": net[2].parameters(), "lr": 0.01, "momentum": 0.5}], lr=0.05, momentum=0.9)


schedule = partial(warmup_cosine, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)


def stopped_steps(run_dir, ranks=2):
    return [json.load(open(os.path.join(run_dir, f"stopped_rank{r}.json"))) for r in range(ranks)]


def logged_steps(run_dir, key):
    return [r["step"] for r in read_metrics(str(run_dir)) if key in r]


# ----- stopping on every rank together ---------------------------------------------------------------------
def test_early_stopping_stops_both_ranks_at_the_same_step(tmp_path):
    # lr=0: the weights never change, so val/loss never improves after the first validation
    # (13 samples: uneven shards on 2 ranks, reduced exactly). patience=2 stops after step 3.
    module = Regressor(lr=0.0, val_samples=13)
    run_trainer(tmp_path, module, max_steps=20, val_every_n_steps=1,
                callbacks=[EarlyStopping(monitor="val/loss", patience=2), StopRecorder()], **DDP)
    ranks = stopped_steps(tmp_path)
    assert [r["step"] for r in ranks] == [3, 3]
    assert all(r["stop"][0] == "EarlyStopping" for r in ranks)
    # Training ended as a normal end would: the last step was logged and on_fit_end ran on rank 0.
    assert logged_steps(tmp_path, "train/loss")[-1] == 3
    assert logged_steps(tmp_path, "val/loss") == [1, 2, 3]  # step 3 validated: no second final validation
    assert (tmp_path / "params.pt").exists()
    log = (tmp_path / "train.log").read_text()
    assert "EarlyStopping stopped training at step 3: val/loss did not improve" in log


def test_timer_stops_both_ranks_at_the_same_step(tmp_path):
    run_trainer(tmp_path, Regressor(), max_steps=20,
                callbacks=[Timer(max_time=1e-6, check_every_n_steps=3), StopRecorder()], **DDP)
    assert [r["step"] for r in stopped_steps(tmp_path)] == [3, 3]
    assert "Timer stopped training at step 3: max_time" in (tmp_path / "train.log").read_text()


def test_a_stop_only_one_rank_wants_is_agreed(tmp_path):
    # Rank 1's clock is over from step 4; the checks are at steps 2, 4, 6 ...: both ranks stop at 4,
    # and rank 0 (which did not ask) learns why.
    run_trainer(tmp_path, Regressor(), max_steps=20,
                callbacks=[SkewedTimer(late_step=4, max_time=3600, check_every_n_steps=2), StopRecorder()], **DDP)
    ranks = stopped_steps(tmp_path)
    assert [r["step"] for r in ranks] == [4, 4]
    assert ranks[0]["stop"][0] == "SkewedTimer on rank 1" and ranks[1]["stop"][0] == "SkewedTimer"
    assert "SkewedTimer on rank 1 stopped training at step 4" in (tmp_path / "train.log").read_text()


def test_missing_monitor_key_is_a_clear_error_on_every_rank(tmp_path):
    with pytest.raises(WorkerFailed, match=r"monitor='val/acc'.*validation metrics are \['val/loss'\]"):
        run_trainer(tmp_path, Regressor(val_samples=8), max_steps=4, val_every_n_steps=2,
                    callbacks=[EarlyStopping(monitor="val/acc")], **DDP)


# ----- hook order ----------------------------------------------------------------------------------------------------
def callback_then_module(*hooks):
    """Lightning's order (trainer/api/hook_table.py): each hook on the callbacks, then on the module."""
    return [(owner, hook, argument) for hook, argument in hooks for owner in ("callback", "module")]


def test_hooks_fire_in_the_documented_order(tmp_path):
    calls: list = []
    # 16 samples, batch 8: two steps per epoch; logged at step 3 and at the last step, validated every 2.
    module = HookOrderRegressor(calls, num_samples=16, val_samples=8)
    run_trainer(tmp_path, module, batch_size=8, max_steps=4, log_every_n_steps=3, val_every_n_steps=2,
                callbacks=[HookRecorder(calls)])
    assert calls == callback_then_module(
        ("on_fit_start", None), ("on_validation_end", 0),  # the sanity pass
        ("on_train_step_end", (1, False)),
        ("on_train_step_end", (2, False)), ("on_validation_end", 2), ("on_train_epoch_end", 0),
        ("on_train_step_end", (3, True)),
        ("on_train_step_end", (4, True)), ("on_validation_end", 4), ("on_train_epoch_end", 1),
        ("on_fit_end", 4),  # step 4 validated: no final validation
    )


def test_a_stop_ends_like_a_normal_end(tmp_path):
    # A stop after step 3 (mid-epoch): as Lightning, a validation, then the cut epoch's end, save_last
    # and on_fit_end, as at a normal end.
    calls: list = []
    module = HookOrderRegressor(calls, num_samples=16, val_samples=8)
    run_trainer(tmp_path, module, batch_size=8, max_steps=10, log_every_n_steps=2, val_every_n_steps=2,
                callbacks=[HookRecorder(calls, stop_at=3)], checkpoint=dict(save_last=True))
    assert calls == callback_then_module(
        ("on_fit_start", None), ("on_validation_end", 0),  # the sanity pass
        ("on_train_step_end", (1, False)),
        ("on_train_step_end", (2, True)), ("on_validation_end", 2), ("on_train_epoch_end", 0),
        ("on_train_step_end", (3, False)),  # the callback asks to stop here
        ("on_validation_end", 3), ("on_train_epoch_end", 1),  # the validation at the stop, the epoch's end
        ("on_fit_end", 3),
    )
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000000003"
    assert logged_steps(tmp_path, "val/loss") == [2, 3]
    # Step 3 was not a logging step: its training metrics were never reduced (that is decided
    # before the step runs), so the last logged ones are step 2's.
    assert logged_steps(tmp_path, "train/loss") == [2]


# ----- learning rate monitor ---------------------------------------------------------------------------------------
def test_lr_monitor_logs_the_schedulers_learning_rates(tmp_path):
    run_trainer(tmp_path, TwoGroupRegressor(), batch_size=8, max_steps=6, log_every_n_steps=2,
                callbacks=[LearningRateMonitor(log_momentum=True)])
    rows = [r for r in read_metrics(str(tmp_path)) if "lr/group0" in r]
    assert [r["step"] for r in rows] == [2, 4, 6]  # logging steps only
    # The same optimizer and schedule stepped by hand: after step k the groups hold get_last_lr().
    optimizer = two_group_sgd(Regressor().net)
    scheduler = schedule(optimizer)
    expected = {}
    for step in range(1, 7):
        optimizer.step()
        scheduler.step()
        expected[step] = scheduler.get_last_lr()
    for row in rows:
        assert [row["lr/group0"], row["lr/group1"]] == pytest.approx(expected[row["step"]], rel=1e-12)
        assert (row["momentum/group0"], row["momentum/group1"]) == (0.9, 0.5)
    assert rows[0]["lr/group0"] != rows[-1]["lr/group0"]  # the schedule really moved


# ----- checkpointed state --------------------------------------------------------------------------------------------
def test_callback_state_is_saved_and_restored_on_resume(tmp_path):
    # First run: 3 validations without improvement after the first, patience 5 -> wait=2 at the save.
    first = EarlyStopping(patience=5)
    run_trainer(tmp_path, Regressor(lr=0.0, val_samples=8), max_steps=3, val_every_n_steps=1,
                callbacks=[first, Timer(max_time=3600)], checkpoint=dict(save_last=True))
    assert (first.wait, first.best_step, first.stopped_step) == (2, 1, None)
    # Resumed with fresh callbacks: the count goes on (stop after step 6 = 1 + patience), and the
    # timer continues from the saved elapsed time.
    resumed, timer = EarlyStopping(patience=5), Timer(max_time=3600)
    run_trainer(tmp_path, Regressor(lr=0.0, val_samples=8), max_steps=20, val_every_n_steps=1,
                callbacks=[resumed, timer], resume=str(tmp_path / "checkpoints"))
    assert resumed.stopped_step == 6 and resumed.best_step == 1
    assert timer._restored_s > 0


# ----- units -------------------------------------------------------------------------------------------------------
class FakeRun:
    def __init__(self):
        self.step, self.stops = 0, []

    def request_stop(self, reason):
        self.stops.append((self.step, reason))


class FakeTrainer:
    sanity_checking = False

    def __init__(self):
        self.run = FakeRun()
        self._run_view = RunView(self.run)


def validations(callback, values):
    trainer = FakeTrainer()
    for step, value in enumerate(values, start=1):
        trainer.run.step = step
        callback.on_validation_end(trainer, None, {"val/loss": value, "val/acc": value})
    return trainer.run.stops


def test_early_stopping_rules():
    assert [s for s, _ in validations(EarlyStopping(patience=2), [3, 2, 2, 2, 1])] == [4]
    # min_delta: 2.95 is not better than 3 by more than 0.1.
    assert [s for s, _ in validations(EarlyStopping(patience=1, min_delta=0.1), [3, 2.95])] == [2]
    assert validations(EarlyStopping(monitor="val/acc", mode="max", patience=1), [0.5, 0.6, 0.7]) == []
    assert [s for s, _ in validations(EarlyStopping(stopping_threshold=1.0), [3, 0.9])] == [2]
    ((step, reason),) = validations(EarlyStopping(), [3, math.nan])
    assert step == 2 and "not finite" in reason
    assert validations(EarlyStopping(check_finite=False, patience=5), [3, math.nan]) == []
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(mode="lowest")
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)


def test_timer_durations():
    assert parse_duration("00:01:00:00") == 3600
    assert parse_duration("01:02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert parse_duration("1:30") == 90 and parse_duration("45") == 45
    assert parse_duration(12.5) == 12.5 and parse_duration(timedelta(hours=2)) == 7200
    assert parse_duration({"minutes": 3}) == 180
    for bad in ("abc", "1:2:3:4:5", 0, -5, "00:00:00:00", "1:-5", {"weeks_": 1}, True):
        with pytest.raises(ValueError, match="max_time"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="check_every_n_steps"):
        Timer(check_every_n_steps=0)


def test_trainer_rejects_what_is_not_a_callback():
    with pytest.raises(TypeError, match="'lr_monitor'.*not a Callback"):
        Trainer(callbacks=["lr_monitor"])
    assert Trainer(callbacks=LearningRateMonitor()).callbacks[0].__class__ is LearningRateMonitor


def test_trainer_max_time_adds_a_timer():
    (timer,) = Trainer(max_time="00:12:00:00").callbacks
    assert isinstance(timer, Timer) and timer.max_time_s == 12 * 3600
    with pytest.raises(ValueError, match="max_time and a Timer"):
        Trainer(max_time=60, callbacks=[Timer()])


# ----- Hydra and train.py ------------------------------------------------------------------------------------------------
def test_hydra_composes_and_builds_the_callbacks(tmp_path):
    overrides = ["recipe=mlp", "callbacks=[lr_monitor,early_stopping]", "callbacks.early_stopping.monitor=val/accuracy",
                 "callbacks.early_stopping.mode=max"]
    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        config = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
        assert "callbacks" not in compose("config", overrides=["recipe=mlp"])  # none by default
    built, _ = build(config, run_dir=str(tmp_path))
    monitor, stopping = built.callbacks
    assert isinstance(monitor, LearningRateMonitor) and isinstance(stopping, EarlyStopping)
    assert (stopping.monitor, stopping.mode, stopping.patience) == ("val/accuracy", "max", 3)
    # trainer.max_time from the command line: a DD:HH:MM:SS string.
    with initialize_config_dir(config_dir=os.path.join(REPO, "conf"), version_base="1.3"):
        config = OmegaConf.to_container(compose("config", overrides=["recipe=mlp", "trainer.max_time=00:00:30:00"]))
    (timer,) = build(config, run_dir=str(tmp_path))[0].callbacks
    assert timer.max_time_s == 30 * 60


@pytest.mark.slow
def test_train_py_with_callbacks_on_two_ranks(tmp_path):
    """The user's command, on 2 spawned ranks; the stopping threshold makes the stop step certain
    (val/loss is ~1.1 at step 5 and ~0.4 at step 10)."""
    args = [sys.executable, "train.py", "recipe=mlp", "callbacks=[lr_monitor,early_stopping]",
            "callbacks.early_stopping.monitor=val/loss", "callbacks.early_stopping.stopping_threshold=0.7",
            "trainer.val_every_n_steps=5", "trainer.log_every_n_steps=5", "trainer.max_steps=50",
            "strategy=ddp", "trainer.devices=2", "data.batch_size=16", "trainer.progress_bar=false",
            "logger=[jsonl]", f"hydra.run.dir={tmp_path}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    assert logged_steps(tmp_path, "lr/group0") == [5, 10]
    assert logged_steps(tmp_path, "val/loss") == [5, 10]
    assert "EarlyStopping stopped training at step 10: val/loss=" in (tmp_path / "train.log").read_text()
