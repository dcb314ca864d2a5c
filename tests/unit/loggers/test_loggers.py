"""Loggers: what each backend wrote, read back with the backend's own format.

TensorBoard scalars through tensorboard's EventAccumulator, CSV rows through ``csv``, W&B offline
runs through their ``.wandb`` record file (decoded with wandb's own protobuf classes), the
``logger=`` config group through Hydra and ``train.py`` (test_logger_configs.py). No test reaches the network: W&B runs
offline (``WANDB_MODE``, or no API key) and its server URL points at a closed local port.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import socket
import struct
import sys
import time

import pytest

from trainer import Trainer
from trainer.loggers import (
    LOGGERS,
    CSVLogger,
    JSONLLogger,
    Logger,
    TensorBoardLogger,
    WandbLogger,
    build_loggers,
    redact_secrets,
)
from trainer.runtime.redact import is_secret_key, redact_argv
from trainer.loggers.wandb_mode import PROXY_VARIABLES, resolve_mode
from trainer.loggers.wandb_run_id import RUN_ID_FILE, adopt_run_id

pytestmark = pytest.mark.timeout(120)

# Fake secrets: none of them may appear in any file a run writes.
ENV_SECRET = "hf_envsecret_0123456789"
CONFIG_SECRET = "cfgsecret-9876543210"
CONFIG_WITH_SECRETS = {
    "optimizer": {"lr": 0.05},
    "data": {"url": f"https://user:{CONFIG_SECRET}@example.org/data", "cache": f"/tmp/{ENV_SECRET}/cache"},
    "wandb": {"api_key": CONFIG_SECRET, "project": "p"},
}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.fixture(autouse=True)
def no_network_wandb(monkeypatch, tmp_path):
    """W&B offline and quiet, its own files under tmp_path, its server a closed local port (no
    proxy in between), and no credentials from this machine (``$NETRC`` points at a missing file)."""
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    for name, sub in (("WANDB_DIR", "default"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                      ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)


# ----- reading back what the backends wrote ----------------------------------------------------------
def tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def tensorboard_text(run_dir, tag: str = "config/text_summary") -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir))
    accumulator.Reload()
    return accumulator.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def read_csv(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def wandb_records(path) -> list:
    """The records of a ``.wandb`` file. Its format is LevelDB's log format behind a 7-byte header
    (``:W&B``, magic 0xBEE1, version): 32 KiB blocks of chunks, each with a 7-byte header
    (crc32c, length, type: 1 full, 2 first, 3 middle, 4 last); each record a ``Record`` protobuf."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if (kind == 0 and length == 0) or position + 7 + length > len(data):
            break  # the end, or a chunk W&B's service is still writing (the caller reads again)
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(run_file) -> tuple[str, dict, list[tuple[int, dict]]]:
    """(run id, config, [(step, {metric: value})]) from an offline run's ``.wandb`` file. W&B's
    service process may still be flushing the file just after ``finish()``: read it again for up
    to 15 s until the run record is there (seen once in CI)."""
    deadline = time.time() + 15
    while True:
        found = _parse_wandb_run(run_file)
        if found[0] is not None or time.time() > deadline:
            return found
        time.sleep(0.2)


def _parse_wandb_run(run_file) -> tuple[str, dict, list[tuple[int, dict]]]:
    run_id, config, history = None, {}, []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            # A name with "/" (train/loss) is stored as nested_key parts.
            values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.append((record.history.step.num, {k: v for k, v in values.items() if not k.startswith("_")}))
    return run_id, config, history


def offline_runs(run_dir) -> list[str]:
    return sorted(glob.glob(os.path.join(str(run_dir), "wandb", "offline-run-*")))


def event_files(run_dir) -> list[str]:
    return glob.glob(os.path.join(str(run_dir), "**", "events.out.tfevents.*"), recursive=True)


def files_containing(run_dir, needles) -> list[str]:
    found = []
    for root, _, names in os.walk(str(run_dir)):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                content = f.read()
            found += [f"{path}: {needle}" for needle in needles if needle.encode() in content]
    return found


# ----- secrets -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["api_key", "apiKey", "WANDB_API_KEY", "hf_token", "token", "client_secret", "password",
                                 "db-passwd", "aws_secret_access_key", "private_key", "credentials", "key"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["max_tokens", "num_tokens", "tokenizer", "pad_token", "eos_token", "key_dim",
                                 "monitor", "loss_normalization", "secretary_count", "author", 3])
def test_ordinary_keys(key):
    assert not is_secret_key(key)


def test_redact_secrets_by_key_env_value_and_url():
    config = {"a": {"api_key": "k-123", "token": None, "lr": 0.1, "tokens": ["x", "y"]}, "hf_token": "abc",
              "list": [{"password": "pw"}, f"prefix-{ENV_SECRET}-suffix"], "url": "s3://me:pass123@bucket/x",
              "short": "root", "loss_normalization": "tokens"}
    environ = {"HF_TOKEN": ENV_SECRET, "PASSWORD": "root", "HOME": "/root"}  # "root": too short to redact
    assert redact_secrets(config, environ) == {
        "a": {"api_key": "***", "token": None, "lr": 0.1, "tokens": ["x", "y"]}, "hf_token": "***",
        "list": [{"password": "***"}, "prefix-***-suffix"], "url": "s3://***@bucket/x",
        "short": "root", "loss_normalization": "tokens",
    }
    assert config["a"]["api_key"] == "k-123"  # a copy: the input is untouched


def test_redact_argv():
    argv = ["train.py", "+data.hf_token=abc123", "logger.wandb.project=p", f"data.path=/x/{ENV_SECRET}", "--multirun",
            "data.url=https://u:pw@host/x", "data.max_tokens=12"]
    assert redact_argv(argv, {"HF_TOKEN": ENV_SECRET}) == [
        "train.py", "+data.hf_token=***", "logger.wandb.project=p", "data.path=/x/***", "--multirun",
        "data.url=https://***@host/x", "data.max_tokens=12"]


# ----- choosing loggers ----------------------------------------------------------------------------------
def test_logger_choices_in_every_form(tmp_path):
    mine = JSONLLogger(str(tmp_path))
    forms = {
        "csv": [("csv", {})],
        ("jsonl", "tensorboard"): [("jsonl", {}), ("tensorboard", {})],
        None: [],
    }
    for given, expected in forms.items():
        assert Trainer(loggers=given).logger_specs == expected
    assert Trainer(loggers={"jsonl": None, "wandb": {"project": "p", "mode": "offline"}}).logger_specs == [
        ("jsonl", {}), ("wandb", {"project": "p", "mode": "offline"})]
    mixed = Trainer(loggers=["jsonl", {"csv": {"filename": "m.csv"}}, mine]).logger_specs
    assert mixed == [("jsonl", {}), ("csv", {"filename": "m.csv"}), mine]
    built = build_loggers(mixed, str(tmp_path))
    assert [type(logger) for logger in built] == [JSONLLogger, CSVLogger, JSONLLogger] and built[2] is mine
    assert built[1].path == os.path.join(str(tmp_path), "m.csv")
    assert build_loggers(["jsonl"], str(tmp_path))[0].path == os.path.join(str(tmp_path), "metrics.jsonl")
    for logger in built:
        logger.finalize()
    assert all(issubclass(backend, Logger) for backend in LOGGERS.values())


@pytest.mark.parametrize(
    "loggers, match",
    [
        (["jsonl", "tensorbord"], r"unknown logger 'tensorbord'; available: csv, jsonl, mlflow, tensorboard, wandb"),
        ({"csv": {"file": "x.csv"}}, r"logger 'csv' has no option\(s\) \['file'\]; its options: filename"),
        ({"wandb": {"mode": "onlin"}}, r"logger.wandb.mode='onlin' is not one of"),
        (["csv", {"csv": {"filename": "b.csv"}}], r"\['csv'\] selected more than once"),
    ],
    ids=["unknown-name", "unknown-option", "bad-wandb-mode", "twice"],
)
def test_bad_logger_choice_fails_when_the_trainer_is_built(loggers, match):
    with pytest.raises(ValueError, match=match):
        Trainer(loggers=loggers)


# ----- backends ----------------------------------------------------------------------------------------
def test_tensorboard_scalars_and_config_read_back(tmp_path):
    logger = TensorBoardLogger.in_run_dir(str(tmp_path))
    logger.log_hyperparams(CONFIG_WITH_SECRETS)
    for step in (1, 2, 3):
        logger.log_metrics({"train/loss": 1.0 / step, "epoch": 0}, step)
    logger.log_metrics({"val/loss": 0.25}, 3)
    logger.finalize()

    scalars = tensorboard_scalars(tmp_path)
    assert sorted(scalars) == ["epoch", "train/loss", "val/loss"]
    assert [step for step, _ in scalars["train/loss"]] == [1, 2, 3]
    assert [value for _, value in scalars["train/loss"]] == pytest.approx([1.0, 0.5, 1 / 3])
    assert scalars["val/loss"] == [(3, 0.25)]
    text = tensorboard_text(tmp_path)
    assert '"lr": 0.05' in text and '"api_key": "***"' in text
    assert files_containing(tmp_path, [CONFIG_SECRET, ENV_SECRET]) == []
    assert len(event_files(tmp_path)) == 1


def test_csv_rows_columns_grow_and_a_step_is_one_row(tmp_path):
    path = tmp_path / "metrics.csv"
    logger = CSVLogger.in_run_dir(str(tmp_path))
    logger.log_metrics({"train/loss": 1.5}, 1)
    assert read_csv(path) == (["step", "train/loss"], [{"step": "1", "train/loss": "1.5"}])  # flushed per row
    logger.log_metrics({"train/loss": 1.25}, 2)
    logger.log_metrics({"val/loss": 1.0}, 2)  # same step, new column: one row, header rewritten
    logger.log_metrics({"train/loss": 1.0}, 3)
    logger.log_metrics({"train/acc": 0.5}, 3)  # same step, new column again
    logger.log_metrics({"train/loss": 0.75, "val/loss": float("nan")}, 4)
    logger.log_metrics({"train/loss": 0.5}, 4)  # same step, known column: the last row rewritten in place
    logger.finalize()
    columns, rows = read_csv(path)
    assert columns == ["step", "train/loss", "val/loss", "train/acc"]
    assert rows == [
        {"step": "1", "train/loss": "1.5", "val/loss": "", "train/acc": ""},
        {"step": "2", "train/loss": "1.25", "val/loss": "1.0", "train/acc": ""},
        {"step": "3", "train/loss": "1.0", "val/loss": "", "train/acc": "0.5"},
        {"step": "4", "train/loss": "0.5", "val/loss": "nan", "train/acc": ""},
    ]
    assert not os.path.exists(str(path) + ".tmp")

    resumed = CSVLogger.in_run_dir(str(tmp_path))  # a resumed run in the same directory appends
    resumed.log_metrics({"train/loss": 0.25}, 5)
    resumed.log_metrics({"lr": 0.1}, 6)
    resumed.finalize()
    columns, rows = read_csv(path)
    assert columns == ["step", "train/loss", "val/loss", "train/acc", "lr"]
    assert [row["step"] for row in rows] == ["1", "2", "3", "4", "5", "6"]
    assert rows[4]["train/loss"] == "0.25" and rows[5]["lr"] == "0.1" and rows[0]["lr"] == ""


def test_wandb_offline_run_holds_config_and_history_and_resume_continues_it(tmp_path, monkeypatch):
    # W&B records the command line: an override with a secret must not reach its files either.
    monkeypatch.setattr(sys, "argv", ["train.py", f"+data.api_key={CONFIG_SECRET}", "trainer.max_steps=3"])
    logger = WandbLogger.in_run_dir(str(tmp_path), project="proj", name="first")
    logger.log_hyperparams(CONFIG_WITH_SECRETS)
    for step in (1, 2, 3):
        logger.log_metrics({"train/loss": 1.0 / step}, step)
    logger.finalize()

    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    (first,) = offline_runs(tmp_path)
    assert first.endswith("-" + run_id)
    recorded_id, config, history = wandb_run(os.path.join(first, f"run-{run_id}.wandb"))
    assert recorded_id == run_id
    assert config["optimizer"] == {"lr": 0.05}
    assert config["wandb"] == {"api_key": "***", "project": "p"}
    assert config["data"]["url"] == "https://***@example.org/data"
    assert [(step, values["train/loss"]) for step, values in history] == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]

    # The job resumed in the same run directory: the same W&B run continues.
    resumed = WandbLogger.in_run_dir(str(tmp_path), project="proj")
    resumed.log_metrics({"train/loss": 0.2}, 4)
    resumed.finalize()
    assert resumed.run_id == run_id
    runs = offline_runs(tmp_path)
    # Both runs carry the id; a second run started in the same second gets a "-1" suffix.
    assert len(runs) == 2 and all(f"-{run_id}" in os.path.basename(run) for run in runs)
    second = next(run for run in runs if run != first)
    recorded_id, _, history = wandb_run(os.path.join(second, f"run-{run_id}.wandb"))
    assert recorded_id == run_id and history == [(4, {"train/loss": 0.2})]
    assert files_containing(tmp_path, [CONFIG_SECRET, ENV_SECRET]) == []
    assert files_containing(tmp_path, ["+data.api_key=***"]) != []  # the redacted command line
    assert sys.argv[1] == f"+data.api_key={CONFIG_SECRET}"  # restored after wandb.init

    # Resumed into a new run directory (from a checkpoint of this one): the id is carried over.
    assert adopt_run_id(str(tmp_path), str(tmp_path / "next")) == run_id
    assert WandbLogger.in_run_dir(str(tmp_path / "next")).run_id is None  # read when the run starts, not before
    assert (tmp_path / "next" / RUN_ID_FILE).read_text().strip() == run_id
    assert adopt_run_id(str(tmp_path / "elsewhere"), str(tmp_path / "fresh")) is None


def test_wandb_mode_auto_follows_the_environment_and_credentials(tmp_path):
    missing = str(tmp_path / "missing-netrc")
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    netrc_file.chmod(0o600)
    assert resolve_mode("auto", {"NETRC": missing}) == "offline"
    assert resolve_mode("auto", {"NETRC": missing, "WANDB_API_KEY": "k" * 40}) == "online"
    assert resolve_mode("auto", {"NETRC": str(netrc_file)}) == "online"
    assert resolve_mode("auto", {"NETRC": str(netrc_file), "WANDB_BASE_URL": "https://wandb.example.org"}) == "offline"
    assert resolve_mode("auto", {"NETRC": missing, "WANDB_API_KEY": "k" * 40, "WANDB_MODE": "offline"}) == "offline"
    assert resolve_mode("auto", {"NETRC": missing, "WANDB_MODE": "disabled"}) == "disabled"
    assert resolve_mode("offline", {"WANDB_API_KEY": "k" * 40}) == "offline"
    assert resolve_mode("online", {}) == "online"
    with pytest.raises(ValueError, match="not one of"):
        resolve_mode("sometimes", {})


def test_wandb_with_a_key_but_no_server_goes_offline_quickly_or_fails_clearly(tmp_path, monkeypatch):
    key = "k0123456789" * 4
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", key)  # auto mode would go online; the server URL is a closed port
    start = time.monotonic()
    logger = WandbLogger.in_run_dir(str(tmp_path / "auto"))
    logger.log_metrics({"loss": 1.0}, 1)
    logger.finalize()
    assert time.monotonic() - start < 30
    assert len(offline_runs(tmp_path / "auto")) == 1
    assert files_containing(tmp_path / "auto", [key]) == []

    strict = WandbLogger.in_run_dir(str(tmp_path / "online"), mode="online")
    strict.log_metrics({"loss": 1.0}, 1)  # queued: the run starts on the logger's writer thread
    with pytest.raises(RuntimeError, match="mode=online but the W&B server .* is unreachable"):
        strict.finalize()  # the writes' error, raised at the next wait
    assert offline_runs(tmp_path / "online") == []


def test_wandb_server_that_never_answers_makes_the_run_offline_after_init_timeout(tmp_path, monkeypatch, caplog):
    with socket.socket() as silent_server:  # accepts connections, never answers
        silent_server.bind(("127.0.0.1", 0))
        silent_server.listen(16)
        monkeypatch.delenv("WANDB_MODE")
        monkeypatch.setenv("WANDB_API_KEY", "k0123456789" * 4)
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{silent_server.getsockname()[1]}")
        start = time.monotonic()
        logger = WandbLogger.in_run_dir(str(tmp_path), init_timeout_s=1)
        logger.log_hyperparams({"a": 1})
        logger.log_metrics({"loss": 1.0}, 1)
        logger.finalize()
    assert time.monotonic() - start < 30  # about 5 s here: wandb's start-up plus the 1 s timeout
    assert "wandb.init failed" in caplog.text and "logging offline" in caplog.text
    (run,) = offline_runs(tmp_path)
    recorded_id, config, history = wandb_run(glob.glob(os.path.join(run, "run-*.wandb"))[0])
    assert recorded_id == logger.run_id and config["a"] == 1 and history == [(1, {"loss": 1.0})]


def test_wandb_disabled_writes_nothing(tmp_path):
    logger = WandbLogger.in_run_dir(str(tmp_path), mode="disabled")
    logger.log_hyperparams({"a": 1})
    logger.log_metrics({"loss": 1.0}, 1)
    logger.finalize()
    assert os.listdir(tmp_path) == []
