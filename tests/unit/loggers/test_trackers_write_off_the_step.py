"""W&B and MLflow write off the training step's path (trainer/loggers/background_writer.py): a
logging step only queues its values, already Python numbers; the library's import, the run's start
and every write happen on the logger's writer thread, in order; a write's error is raised at the
next wait (``save``, ``finalize``); what is queued when a script exits without ``finalize`` is
written before W&B ends its run. And the CSV logger does nothing on a quiet step."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import types

import pytest
import torch

from tests.support.helpers import Regressor
from tests.unit.loggers.test_loggers import no_network_wandb, offline_runs, wandb_run  # noqa: F401 (a fixture)
from trainer import Trainer
from trainer.loggers import CSVLogger, MLFlowLogger, WandbLogger

pytestmark = pytest.mark.timeout(180)
WRITER_THREAD = "logger-writer"


def fake_wandb(monkeypatch, calls: list, release: threading.Event, fail_log: bool = False) -> None:
    """A ``wandb`` module that records each call with its thread; ``init`` waits for ``release``."""

    class Run:
        id, dir, starting_step = "fake", None, 0
        config = types.SimpleNamespace(update=lambda config, allow_val_change: calls.append(("config", config)))

        def log(self, values, step=None):
            if fail_log:
                raise OSError("disk full")
            calls.append(("log", values, step, threading.current_thread().name))

        def finish(self):
            calls.append(("finish", threading.current_thread().name))

    def init(mode, **options):
        release.wait(30)
        calls.append(("init", threading.current_thread().name))
        return Run()

    module = types.ModuleType("wandb")
    module.init, module.Settings, module.teardown = init, (lambda **settings: settings), (lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", module)


def test_wandb_starts_and_writes_on_its_thread_what_the_step_queued_as_python_numbers(tmp_path, monkeypatch):
    calls: list = []
    release = threading.Event()
    fake_wandb(monkeypatch, calls, release)
    logger = WandbLogger.in_run_dir(str(tmp_path), project="p", mode="offline")
    logger.log_hyperparams({"lr": 0.1})
    loss = torch.tensor(1.5)
    logger.log_metrics({"train/loss": loss, "epoch": 0}, 1)  # returns while wandb.init still waits
    loss.add_(1.0)  # the training goes on changing its tensors: the queued value is the number it had
    assert calls == []
    release.set()
    logger.log_metrics({"train/loss": 0.5}, 2)
    logger.finalize()
    assert [call[0] for call in calls] == ["init", "log", "log", "finish"]
    assert {call[-1] for call in calls} == {WRITER_THREAD}
    (first, second) = [call[1:3] for call in calls if call[0] == "log"]
    assert first == ({"train/loss": 1.5, "epoch": 0}, 1) and type(first[0]["train/loss"]) is float
    assert second == ({"train/loss": 0.5}, 2)


def test_a_failed_wandb_write_is_raised_at_the_next_wait_and_the_run_still_ends(tmp_path, monkeypatch):
    calls: list = []
    release = threading.Event()
    release.set()
    fake_wandb(monkeypatch, calls, release, fail_log=True)
    logger = WandbLogger.in_run_dir(str(tmp_path), project="p", mode="offline")
    logger.log_metrics({"loss": 1.0}, 1)  # the step itself does not fail
    with pytest.raises(OSError, match="disk full"):
        logger.finalize()
    assert [call[0] for call in calls] == ["init", "finish"]


@pytest.mark.parametrize("started", [False, True], ids=["the run starting at exit", "the run started"])
def test_what_a_script_queued_for_wandb_is_in_its_run_when_it_exits_without_finalize(started, tmp_path):
    # Started: W&B's own exit hooks are in place; starting at exit (wandb.init on the writer thread,
    # from what was queued): they are registered too late to run, and the logger's own hook ends the run.
    script = textwrap.dedent(f"""
        from trainer.loggers import WandbLogger

        logger = WandbLogger.in_run_dir({str(tmp_path)!r}, project="p", mode="offline")
        for step in range(1, 6):
            logger.log_metrics({{"loss": float(step)}}, step)
            if step == 2 and {started}:
                logger.save()  # the run started, steps 1 and 2 written; 3 to 5 are queued at exit
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = offline_runs(tmp_path)
    run_id = open(tmp_path / "wandb_run_id").read().strip()
    _, _, history = wandb_run(f"{run}/run-{run_id}.wandb")
    assert history == [(step, {"loss": float(step)}) for step in range(1, 6)]


def test_mlflow_starts_and_writes_on_its_thread_and_raises_a_failed_write_at_the_next_wait(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    threads, original = [], MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        threads.append(threading.current_thread().name)
        assert all(type(metric.value) is float for metric in metrics)
        return original(self, run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    logger = MLFlowLogger.in_run_dir(str(tmp_path / "run"), tracking_uri=str(tmp_path / "store"))
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train/loss": torch.tensor(0.25), "epoch": 0}, 1)
    logger.save()
    assert threads == [WRITER_THREAD, WRITER_THREAD]  # the params, then the metrics
    client = MlflowClient(f"sqlite:///{tmp_path}/store/mlflow.db")
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train/loss")] == [(1, 0.25)]

    def broken(self, run_id, metrics=(), params=(), tags=()):
        raise OSError("the store is gone")

    monkeypatch.setattr(MlflowClient, "log_batch", broken)
    logger.log_metrics({"train/loss": 0.125}, 2)  # the step itself does not fail
    with pytest.raises(OSError, match="the store is gone"):
        logger.finalize()
    assert client.get_run(logger.run_id).info.status == "FINISHED"  # the run still ended


def test_the_csv_logger_does_nothing_on_a_quiet_step(tmp_path, monkeypatch):
    calls: list = []
    for name in ("log_metrics", "log_hyperparams", "save", "_open", "_rewrite", "_encode"):
        method = getattr(CSVLogger, name)
        monkeypatch.setattr(CSVLogger, name, lambda self, *args, _name=name, _method=method, **kwargs:
                            (calls.append((_name, self_step(self))), _method(self, *args, **kwargs))[1])
    steps: list = []

    def self_step(logger):
        return steps[-1] if steps else 0

    class Counted(Regressor):
        def on_train_batch_start(self, batch, batch_idx):
            steps.append(self.trainer.global_step + 1)

    trainer = Trainer(max_steps=12, batch_size=16, log_every_n_steps=5, loggers=["csv"], progress_bar=False,
                      checkpoint=None, enable_model_summary=False, num_sanity_val_steps=0, run_dir=str(tmp_path))
    trainer.fit(Counted())
    assert steps == list(range(1, 13))
    assert {step for _, step in calls} <= {0, 5, 10, 12}, calls  # the logging steps, the last one, the start
    assert [step for name, step in calls if name == "log_metrics"] == [5, 10, 12]
