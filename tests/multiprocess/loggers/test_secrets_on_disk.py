"""No secret typed on the command line or read from the environment reaches a file of the run
directory: checkpoints (``trainer_state.json``), Hydra's ``.hydra/*.yaml`` and ``multirun.yaml``,
``train.log``, metrics. Same rules as the loggers (trainer/runtime/redact.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.command_line import TRAIN, run

pytestmark = pytest.mark.timeout(240)

SECRETS = {
    "typed": "SECRETVALUE",           # +hub.hf_token=... (a top-level key nothing reads: a warning, not an error)
    "api_key": "KEYVALUE123",         # +wandb.api_key=... (a typical key)
    "password": "PWVALUE123",         # +hub.db_password=...
    "env": "ENVSECRET12345",          # HF_TOKEN in the environment, interpolated under a plain key
    "env_keyed": "ENVKEYED12345",     # MY_SERVICE_TOKEN interpolated under a secret key
}
OVERRIDES = [
    "recipe=mlp", "trainer.max_steps=2", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null",
    "trainer.progress_bar=false", f"+hub.hf_token={SECRETS['typed']}", f"+wandb.api_key={SECRETS['api_key']}",
    f"+hub.db_password={SECRETS['password']}", "+hub.source=${oc.env:HF_TOKEN}",
    "+hub.service_token=${oc.env:MY_SERVICE_TOKEN}",
]


def run_with_secrets(args: list[str], monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRETS["env"])  # the subprocess inherits the environment
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRETS["env_keyed"])
    return run(args)


def files_with_secrets(root: Path) -> dict[str, list[str]]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            data = (Path(folder) / name).read_bytes()
            hits = [kind for kind, value in SECRETS.items() if value.encode() in data]
            if hits:
                found[os.path.relpath(os.path.join(folder, name), root)] = hits
    return found


def test_no_secret_in_any_file_of_the_run_directory(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    result = run_with_secrets(TRAIN + OVERRIDES + [f"hydra.run.dir={run_dir}"], monkeypatch)
    assert result.returncode == 0, result.describe()
    files = {os.path.relpath(os.path.join(f, n), run_dir) for f, _, ns in os.walk(run_dir) for n in ns}
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "train.log"} <= files, files
    assert any(f.endswith("trainer_state.json") for f in files), files
    assert files_with_secrets(run_dir) == {}
    # The keys are still there, redacted (not dropped).
    assert "hf_token: '***'" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "+hub.hf_token=***" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def test_no_secret_in_a_multirun_sweep(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    result = run_with_secrets(TRAIN + ["-m"] + OVERRIDES + ["trainer.seed=1", f"hydra.sweep.dir={sweep}"], monkeypatch)
    assert result.returncode == 0, result.describe()
    assert (sweep / "multirun.yaml").is_file() and (sweep / "0" / ".hydra" / "hydra.yaml").is_file()
    assert files_with_secrets(sweep) == {}


def test_a_refused_secret_override_is_not_echoed(tmp_path, monkeypatch):
    # A +data key that nothing reads is refused; the error names the key, not its value.
    result = run_with_secrets(TRAIN + OVERRIDES[:5] + [f"+data.hf_token={SECRETS['typed']}", f"hydra.run.dir={tmp_path}"],
                              monkeypatch)
    assert result.returncode != 0 and "data.hf_token" in result.stderr, result.describe()
    assert SECRETS["typed"] not in result.output, result.describe()
    assert files_with_secrets(tmp_path) == {}
