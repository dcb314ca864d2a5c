"""Every dashboard holds every logged step once, with its value, after several kill -9 + resume cycles.

One process, every logger on (jsonl, csv, TensorBoard, W&B offline, MLflow in a local store), 20 steps with a checkpoint and a
validation every 4. The job is killed three times: as step 9 starts (right after the commit of step
8: nothing logged since), after step 15 (three steps past the checkpoint of step 12) and after step
18 (two past 16), each time resumed with ``resume=auto``; the last attempt finishes. Each dashboard
is read in its own format and compared with the same dashboard of one uninterrupted run (same
seed): metrics.jsonl and metrics.csv as files, TensorBoard through its EventAccumulator (all event
files of the folder), W&B as ``wandb sync`` uploads a resumed run: the history rows of every
``.wandb`` file of the run id, file after file in the order they were started, MLflow through its own
client (each metric's history in the run whose id the run directory keeps). Tolerance: none (the
resume is bitwise on CPU, tests/multiprocess/checkpoint/test_checkpoint.py; every value is compared
with ``==``).
"""

from __future__ import annotations

import glob
import json
import os
import time

import numpy
import pytest

from tests.support.run_fit import run_fit
from tests.unit.loggers.test_loggers import closed_port, read_csv, tensorboard_scalars, wandb_records, wandb_run
from trainer.loggers.wandb_mode import PROXY_VARIABLES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

STEPS = 20
LOGGERS = {"jsonl": {}, "csv": {}, "tensorboard": {}, "wandb": {"project": "p", "mode": "offline"}}
TRAINER = dict(strategy="single", devices=1, batch_size=16, max_steps=STEPS, val_every_n_steps=4, loggers=LOGGERS,
               checkpoint=dict(every_n_steps=4, keep_last=None))
MODULE = {"val_samples": 32}
#: (module class, its kill option) of each killed attempt
KILLS = [("tests.support.helpers.KilledBeforeStep", {"kill_before_step": 9}),
         ("tests.support.helpers.CheckpointedRegressor", {"kill_at_step": 15}),
         ("tests.support.helpers.CheckpointedRegressor", {"kill_at_step": 18})]


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    """W&B offline, quiet, its files under tmp_path, its server a closed local port, no credentials."""
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def attempt(run_dir, module_class=None, module=None, **trainer):
    # MLflow's store beside the run directories: one store, a run for the whole job and one for the killed job.
    loggers = {**LOGGERS, "mlflow": {"tracking_uri": os.path.join(os.path.dirname(str(run_dir)), "mlruns")}}
    spec = {"run_dir": str(run_dir), "module": {**MODULE, **(module or {})},
            "trainer": {**TRAINER, "loggers": loggers, **trainer}}
    if module_class:
        spec["module_class"] = module_class
    return run_fit(spec, timeout=240)


def wandb_history(run_dir) -> list[tuple[int, dict]]:
    """The history rows W&B shows for the run after every offline folder is synced: each folder's
    ``.wandb`` file in the order the attempts started (the time in the folder's name)."""
    folders = glob.glob(os.path.join(str(run_dir), "wandb", "offline-run-*"))
    folders.sort(key=lambda folder: os.path.basename(folder).split("-")[2])
    wandb_run(glob.glob(os.path.join(folders[-1], "*.wandb"))[0])  # (waits for W&B's service to write the finished run)
    rows = []
    for folder in folders:
        started = glob.glob(os.path.join(folder, "*.wandb"))
        if not started:  # an attempt killed while W&B was starting its run (on the logger's thread): nothing in it
            continue
        (run_file,) = started
        for record in wandb_records(run_file):
            if record.WhichOneof("record_type") == "history":
                values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                          for item in record.history.item}
                rows.append((record.history.step.num, {k: v for k, v in values.items() if not k.startswith("_")}))
    return rows


def mlflow_history(run_dir) -> list[tuple[int, dict]]:
    """The rows MLflow shows for the job's run (the id kept in the run directory), one per step."""
    from mlflow.tracking import MlflowClient

    with open(os.path.join(str(run_dir), "mlflow_run_id")) as handle:
        run_id = handle.read().strip()
    from trainer.loggers.mlflow_store import DATABASE_FILE

    # (the local store a directory names: its database, as `mlflow ui --backend-store-uri` reads it)
    client = MlflowClient(tracking_uri=f"sqlite:///{os.path.dirname(str(run_dir))}/mlruns/{DATABASE_FILE}")
    rows: dict[int, dict] = {}
    for key in client.get_run(run_id).data.metrics:
        for point in client.get_metric_history(run_id, key):
            assert key not in rows.get(point.step, {}), f"MLflow holds {key} of step {point.step} twice"
            rows.setdefault(point.step, {})[key] = point.value
    return sorted(rows.items())


def dashboards(run_dir) -> dict:
    with open(os.path.join(str(run_dir), "metrics.jsonl")) as f:
        jsonl = [json.loads(line) for line in f]
    return {"jsonl": jsonl, "csv": read_csv(os.path.join(str(run_dir), "metrics.csv")),
            "tensorboard": tensorboard_scalars(run_dir), "wandb": wandb_history(run_dir),
            "mlflow": mlflow_history(run_dir)}


def test_every_dashboard_holds_every_step_once_after_kill_and_resume_cycles(tmp_path):
    reference = tmp_path / "whole"
    assert attempt(reference).returncode == 0
    expected = dashboards(reference)
    steps = list(range(1, STEPS + 1))
    assert [step for step, _ in expected["wandb"]] == steps  # (the uninterrupted run: each step once)
    assert all([step for step, _ in points] == steps for tag, points in expected["tensorboard"].items()
               if tag.startswith("train/")), expected["tensorboard"]

    run_dir = tmp_path / "killed"
    for number, (module_class, kill) in enumerate(KILLS):
        killed = attempt(run_dir, module_class, kill, **({"resume": "auto"} if number else {}))
        assert killed.returncode == -9, killed.stderr[-3000:]
        time.sleep(1)  # the next attempt's W&B folder is named for a later second (their order above)
    assert attempt(run_dir, resume="auto").returncode == 0

    found = dashboards(run_dir)
    # A W&B run file per attempt that started its run before it was killed: W&B starts on the logger's writer
    # thread, and a first attempt killed before it did holds none (the next one logs its steps from
    # metrics.jsonl); a resumed attempt starts its run before its first step (resume_at).
    assert 3 <= len(glob.glob(os.path.join(str(run_dir), "wandb", "offline-run-*", "*.wandb"))) <= 4
    # The trained values equal the uninterrupted run's in every dashboard (timings differ: left out here).
    assert [trained(row) for row in found["jsonl"]] == [trained(row) for row in expected["jsonl"]]
    assert [trained(row) for row in found["csv"][1]] == [trained(row) for row in expected["csv"][1]]
    assert {tag: points for tag, points in found["tensorboard"].items() if trained({tag: 0})} == \
        {tag: points for tag, points in expected["tensorboard"].items() if trained({tag: 0})}
    assert [(step, trained(row)) for step, row in found["wandb"]] == [(step, trained(row)) for step, row in expected["wandb"]]
    # Every dashboard holds each step once, with metrics.jsonl's values (timings included).
    rows = by_step(found["jsonl"])
    assert [step for step, _ in rows] == steps
    assert [(int(row.pop("step")), {k: float(v) for k, v in row.items() if v != ""}) for row in found["csv"][1]] == \
        [(step, {k: float(v) for k, v in row.items()}) for step, row in rows]
    assert found["tensorboard"] == {tag: [(step, float(numpy.float32(row[tag]))) for step, row in rows if tag in row]
                                    for tag in {tag for _, row in rows for tag in row}}
    assert found["wandb"] == rows
    # MLflow keeps a metric's points (none can be taken back): the steps a killed attempt logged past its
    # checkpoint keep that attempt's timings, and the resumed attempt skips them; the trained values are the same.
    assert [(step, trained(row)) for step, row in found["mlflow"]] == [(step, trained(row)) for step, row in rows]
    assert [(step, trained(row)) for step, row in found["mlflow"]] == \
        [(step, trained(row)) for step, row in expected["mlflow"]]


def trained(row: dict) -> dict:
    """A row without the timings and memory figures (which differ from run to run)."""
    return {k: v for k, v in row.items() if not k.startswith(("perf/", "memory/"))}


def by_step(jsonl: list[dict]) -> list[tuple[int, dict]]:
    """metrics.jsonl's lines merged into one row per step (the training and validation calls of a step)."""
    rows: dict[int, dict] = {}
    for line in jsonl:
        rows.setdefault(line["step"], {}).update({k: v for k, v in line.items() if k != "step"})
    return sorted(rows.items())
