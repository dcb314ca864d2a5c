"""No secret reaches any file a run writes with every logger on (jsonl, csv, TensorBoard, W&B
offline), settings included: W&B's run settings (notes, name, tags, group) are redacted by the same
rule as the config (trainer/runtime/redact.py). Each file, the W&B ``.wandb`` run file and the
TensorBoard event file included, is read as bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.command_line import TRAIN, run

pytestmark = pytest.mark.timeout(240)

SECRETS = {
    "typed": "TYPEDSECRET123",         # an override under a secret-named key, then interpolated into settings
    "env_setting": "hf_ENVSECRET12345",  # HF_TOKEN, interpolated into W&B settings (${oc.env:HF_TOKEN})
    "env_only": "AWSSECRET987654",      # AWS_SECRET_ACCESS_KEY: in the environment, named nowhere
}
OVERRIDES = [
    "recipe=mlp", "trainer.max_steps=2", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null",
    "trainer.progress_bar=false", "logger=[jsonl,csv,tensorboard,wandb]", "logger.wandb.mode=offline",
    f"+hub.hf_token={SECRETS['typed']}",
    "logger.wandb.notes=run for ${oc.env:HF_TOKEN}",
    "logger.wandb.name=n-${oc.env:HF_TOKEN}",
    "logger.wandb.tags=[t-${oc.env:HF_TOKEN},k-${hub.hf_token}]",
    "logger.wandb.group=g-${hub.hf_token}",
]


def files_with_secrets(root: Path) -> dict[str, list[str]]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if not path.exists():  # a link to a file W&B has removed since
                continue
            data = path.read_bytes()
            hits = [kind for kind, value in SECRETS.items() if value.encode() in data]
            if hits:
                found[os.path.relpath(path, root)] = hits
    return found


def test_no_secret_in_any_file_a_run_writes_with_every_logger(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("HF_TOKEN", SECRETS["env_setting"])  # the subprocess inherits the environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRETS["env_only"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # W&B's own files: searched too
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    result = run(TRAIN + OVERRIDES + [f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.describe()
    assert not any(value in result.output for value in SECRETS.values()), result.describe()

    files = {os.path.relpath(os.path.join(f, n), run_dir) for f, _, ns in os.walk(run_dir) for n in ns}
    wandb_runs = [f for f in files if f.startswith("wandb/offline-run-") and f.endswith(".wandb")]
    events = [f for f in files if "tfevents" in f]
    assert wandb_runs and events, files
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.jsonl", "metrics.csv", "train.log"} <= files, files
    assert any(f.endswith("trainer_state.json") for f in files), files
    assert files_with_secrets(tmp_path) == {}
    # The settings reached W&B, redacted (not dropped): the search above could have found them.
    run_file = (run_dir / wandb_runs[0]).read_bytes()
    for setting in (b"run for ***", b"n-***", b"t-***", b"k-***", b"g-***"):
        assert setting in run_file, setting
    assert b"run for ***" in (run_dir / events[0]).read_bytes()  # the config's text in TensorBoard


def test_a_refused_setting_read_from_a_secret_variable_is_not_echoed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRETS["env_setting"])
    result = run(TRAIN + OVERRIDES[:5] + ["logger=[jsonl,wandb]", "logger.wandb.mode=${oc.env:HF_TOKEN}",
                                          f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode != 0 and "logger.wandb.mode='***'" in result.stderr, result.describe()
    assert SECRETS["env_setting"] not in result.output, result.describe()
    assert files_with_secrets(tmp_path) == {}
