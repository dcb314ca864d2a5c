"""The MLflow logger against a real ``mlflow server`` on 127.0.0.1 (one for the session, its own
SQLite store under a temporary folder, its process group stopped at the end) and against local
stores, read back through MLflow's own client: metrics equal metrics.jsonl, also after a resume
(every step once), params and tags without secrets, the run's status; Lightning's ``MLFlowLogger``
constructor in the mirror."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.api.module import TrainModule  # noqa: E402
from trainer.checkpoint.layout import checkpoint_name  # noqa: E402
from trainer.loggers import MLFlowLogger  # noqa: E402
from trainer.loggers.resume_history import read_jsonl  # noqa: E402
from trainer.loggers.wandb_run_id import MLFLOW_RUN_ID_FILE, adopt_run_id  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SECRET = "sk-mlflow-secret-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_server(url: str, process: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"mlflow server at {url} did not answer within {timeout_s} s")


def stop_group(process: subprocess.Popen) -> None:
    """Stop the server and every process it started (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind by the server, if any
    except ProcessLookupError:
        pass
    process.wait(timeout=15)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """The URL of an ``mlflow server`` on 127.0.0.1 with a temporary backend store, stopped after the session."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
               "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1"]
    with open(root / "server.log", "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url, process)
        yield url
    finally:
        stop_group(process)


@pytest.fixture(autouse=True)
def no_tracking_uri_from_outside(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


class Regression(TrainModule):
    """A tiny regression that logs its loss every step."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = (self.layer(x) - y).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def run_fit(run_dir, mlflow_options, max_steps, ckpt_path=None, **args) -> None:
    torch.manual_seed(0)
    trainer = Trainer(run_dir=str(run_dir), max_steps=max_steps, log_every_n_steps=1, progress_bar=False,
                      enable_model_summary=False, loggers={"jsonl": {}, "mlflow": mlflow_options},
                      config={"optimizer": {"lr": 0.05}, "tracker": {"api_key": SECRET, "team": "vision"}}, **args)
    trainer.fit(Regression(), ckpt_path=ckpt_path)


def jsonl_history(run_dir, name="train/loss") -> list[tuple[int, float]]:
    return [(row["step"], row[name]) for row in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if name in row]


def mlflow_history(client, run_id, name="train/loss") -> list[tuple[int, float]]:
    return sorted((point.step, point.value) for point in client.get_metric_history(run_id, name))


def run_id_of(run_dir) -> str:
    with open(os.path.join(run_dir, MLFLOW_RUN_ID_FILE)) as f:
        return f.read().strip()


def test_a_fit_logged_to_a_server_reads_back_equal_to_metrics_jsonl(tmp_path, mlflow_server):
    run_dir = tmp_path / "run"
    run_fit(run_dir, {"tracking_uri": mlflow_server, "experiment_name": "server-fit", "run_name": "first",
                      "tags": {"team": "vision"}}, max_steps=5)
    client = MlflowClient(mlflow_server)
    run = client.get_run(run_id_of(run_dir))
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert client.get_experiment(run.info.experiment_id).name == "server-fit"
    expected = jsonl_history(run_dir)
    assert [step for step, _ in expected] == [1, 2, 3, 4, 5]
    assert mlflow_history(client, run.info.run_id) == [(s, pytest.approx(v, rel=1e-6)) for s, v in expected]
    assert run.data.params["optimizer/lr"] == "0.05" and run.data.params["tracker/api_key"] == "***"
    assert run.data.tags["team"] == "vision"
    assert run.data.tags["checkpoint"].endswith(os.path.join("checkpoints", checkpoint_name(5)))
    config = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    text = open(config).read()
    assert "api_key: '***'" in text and "lr: 0.05" in text
    everything = json.dumps({"params": run.data.params, "tags": run.data.tags}) + text
    assert SECRET not in everything


def test_a_resumed_run_continues_the_same_mlflow_run_logging_every_step_once(tmp_path, mlflow_server):
    run_dir = tmp_path / "run"
    options = {"tracking_uri": mlflow_server, "experiment_name": "resumed"}
    checkpoint = {"every_n_steps": 3, "keep_last": None}
    run_fit(run_dir, options, max_steps=6, checkpoint=checkpoint)  # killed after step 6: steps 4-6 past the save
    run_id = run_id_of(run_dir)
    client = MlflowClient(mlflow_server)
    client.update_run(run_id, status="RUNNING")  # as a kill -9 leaves it
    run_fit(run_dir, options, max_steps=8, checkpoint=checkpoint, ckpt_path=str(run_dir / "checkpoints" / checkpoint_name(3)))
    assert run_id_of(run_dir) == run_id
    expected = jsonl_history(run_dir)
    assert [step for step, _ in expected] == list(range(1, 9))
    assert mlflow_history(client, run_id) == [(s, pytest.approx(v, rel=1e-6)) for s, v in expected]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([client.get_experiment_by_name("resumed").experiment_id])) == 1


def test_the_logger_fills_steps_the_store_lacks_and_skips_those_it_holds(tmp_path):
    store = tmp_path / "store"
    first = MLFlowLogger.in_run_dir(str(tmp_path / "run"), tracking_uri=str(store))
    for step in range(1, 5):  # what MLflow got before the kill (say, the server was down for 5 and 6)
        first.log_metrics({"train/loss": 1.0 / step}, step)
    first.save()  # (written by its writer thread: what the store holds when the job is killed)
    resumed = MLFlowLogger.in_run_dir(str(tmp_path / "run"), tracking_uri=str(store))
    history = [(step, {"train/loss": 1.0 / step}) for step in range(1, 7)]
    resumed.resume_at(6, history, dropped_from=7)
    for step in (4, 7):  # a step it holds, and a new one
        resumed.log_metrics({"train/loss": 10.0 + step}, step)
    resumed.finalize("failed")
    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    assert mlflow_history(client, first.run_id) == [(s, pytest.approx(1.0 / s)) for s in range(1, 7)] + [(7, 17.0)]
    assert resumed.run_id == first.run_id and client.get_run(first.run_id).info.status == "FAILED"


def test_a_local_directory_store_and_a_file_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_fit(tmp_path / "run", {"tracking_uri": "mlruns", "experiment_name": "local"}, max_steps=3)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    run = client.get_run(run_id_of(tmp_path / "run"))
    assert mlflow_history(client, run.info.run_id) == [(s, pytest.approx(v, rel=1e-6))
                                                        for s, v in jsonl_history(tmp_path / "run")]
    assert run.info.artifact_uri.startswith((tmp_path / "mlruns" / "artifacts").as_uri())
    assert os.path.isfile(os.path.join(run.info.artifact_uri[len("file://"):], "config.yaml"))

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    file_uri = (tmp_path / "file-store").as_uri()
    logger = MLFlowLogger(experiment_name="files", tracking_uri=file_uri)
    logger.log_metrics({"loss": 0.5}, 1)
    logger.finalize()
    assert mlflow_history(MlflowClient(file_uri), logger.run_id, "loss") == [(1, 0.5)]
    assert logger.save_dir == str(tmp_path / "file-store")


def test_a_run_resumed_into_a_new_run_directory_adopts_the_mlflow_run(tmp_path):
    logger = MLFlowLogger.in_run_dir(str(tmp_path / "first"), tracking_uri=str(tmp_path / "store"))
    logger.log_metrics({"loss": 1.0}, 1)
    logger.save()  # (the run starts on the logger's writer thread; this waits for it)
    adopt_run_id(str(tmp_path / "first"), str(tmp_path / "second"))
    assert run_id_of(tmp_path / "second") == logger.run_id
    again = MLFlowLogger.in_run_dir(str(tmp_path / "second"), tracking_uri=str(tmp_path / "store"))
    assert again.run_id == logger.run_id


def test_no_secret_reaches_mlflow_params_tags_or_run_name(tmp_path):
    logger = MLFlowLogger.in_run_dir(str(tmp_path / "run"), tracking_uri=str(tmp_path / "store"),
                                     run_name=f"run with {SECRET}", tags={"note": f"key {SECRET}"})
    logger.log_hyperparams({"service": {"api_key": SECRET, "url": f"https://user:{SECRET}@example.org"}})
    logger.finalize()
    run = MlflowClient(f"sqlite:///{tmp_path}/store/mlflow.db").get_run(logger.run_id)
    assert run.data.params == {"service/api_key": "***", "service/url": "https://***@example.org"}
    assert SECRET not in json.dumps([run.data.tags, run.info.run_name])


def test_lightnings_constructor_in_the_mirror(tmp_path, monkeypatch):
    from trainer.lightning.loggers import MLFlowLogger as Mirrored
    from trainer.lightning.loggers.mlflow import MLFlowLogger as FromModule

    assert Mirrored is FromModule is MLFlowLogger
    monkeypatch.chdir(tmp_path)
    logger = Mirrored(experiment_name="lightning", run_name="r", tags={"a": "b"}, save_dir=str(tmp_path / "ml"),
                      prefix="fit")
    assert logger.version is None  # nothing starts before it is used
    assert isinstance(logger.experiment, MlflowClient)
    assert logger.experiment.get_run(logger.run_id).info.experiment_id == logger.experiment_id
    logger.log_metrics({"loss": 0.25}, 2)
    logger.finalize("success")
    assert mlflow_history(logger.experiment, logger.run_id, "fit-loss") == [(2, 0.25)]
    assert logger.save_dir == str(tmp_path / "ml") and logger.name == logger.experiment_id
    for arguments, match in (({"log_model": True}, "log_model"), ({"synchronous": False}, "synchronous"),
                             ({"checkpoint_path_prefix": "x"}, "checkpoint_path_prefix")):
        with pytest.raises(ValueError, match=match):
            Mirrored(**arguments)
    with pytest.raises(ValueError, match="no such run"):
        _ = Mirrored(save_dir=str(tmp_path / "ml"), run_id="0" * 32).run_id


def test_other_ranks_write_nothing_and_mlflow_is_not_imported_until_used(tmp_path, monkeypatch):
    code = ("import sys; from trainer.loggers import build_loggers; "
            "build_loggers(['jsonl', 'mlflow'], sys.argv[1]); print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "False"
    from trainer.loggers import base

    monkeypatch.setattr(base.distributed, "rank", lambda: 1)
    logger = MLFlowLogger.in_run_dir(str(tmp_path / "run"), tracking_uri=str(tmp_path / "store"))
    logger.log_metrics({"loss": 1.0}, 1)
    assert type(logger.experiment).__name__ == "DummyExperiment" and not os.path.exists(tmp_path / "store")
