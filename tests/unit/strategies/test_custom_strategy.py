"""Adding a strategy is one Python file plus one yaml: ``tests/support/custom_strategy/`` holds
both, outside the package, and is registered like any other through its config directory, on the
command line (``hydra.searchpath``) and in the Python API (``add_config_dir``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.helpers import REPO, Regressor, new_trainer
from trainer.strategies import add_config_dir, available_strategies, registry, resolve_strategy

CUSTOM = os.path.join(REPO, "tests", "support", "custom_strategy")


@pytest.fixture
def registered(monkeypatch):
    """``tests/support/custom_strategy`` on the registry's search path for this test only."""
    monkeypatch.setattr(registry, "_extra_dirs", [])
    add_config_dir(CUSTOM)


def read_count(path) -> int:
    with open(path) as f:
        return int(f.read())


def test_python_api_resolves_a_registered_strategy(registered, tmp_path):
    assert "counting" in available_strategies()
    record = tmp_path / "steps.txt"
    strategy = resolve_strategy("counting", record=str(record))
    assert type(strategy).__name__ == "CountingStrategy"
    new_trainer(tmp_path / "run", strategy=strategy, max_steps=3).fit(Regressor())
    assert read_count(record) == 3


def test_python_api_takes_the_yamls_values_under_the_options(monkeypatch, tmp_path):
    # A yaml's own setting reaches the strategy built from its name (as on the command line); a
    # keyword option wins over it.
    folder = tmp_path / "conf" / "strategy"
    folder.mkdir(parents=True)
    (folder / "counting_here.yaml").write_text(
        "_target_: tests.support.custom_strategy.counting_strategy.CountingStrategy\n"
        "accelerator: ${trainer.accelerator}\n"
        f"record: {tmp_path / 'from_yaml.txt'}\n")
    monkeypatch.setattr(registry, "_extra_dirs", [])
    add_config_dir(str(tmp_path / "conf"))
    assert resolve_strategy("counting_here").record == str(tmp_path / "from_yaml.txt")
    assert resolve_strategy("counting_here", record="given").record == "given"


def test_unregistered_directory_and_unknown_name_are_errors(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_extra_dirs", [])
    with pytest.raises(ValueError, match="unknown strategy 'counting'; available: ddp, fsdp, nd, pipeline, single"):
        resolve_strategy("counting")
    with pytest.raises(ValueError, match="no strategy/ folder"):
        add_config_dir(str(tmp_path))


@pytest.mark.slow
def test_command_line_runs_a_strategy_from_the_search_path(tmp_path):
    record = tmp_path / "steps.txt"
    env = {**os.environ, "PYTHONPATH": REPO}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "train.py", f"hydra.searchpath=[file://{CUSTOM}]", "strategy=counting",
         f"strategy.record={record}", "recipe=mlp", "trainer.max_steps=2", "trainer.val_every_n_steps=null",
         "trainer.progress_bar=false", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_count(record) == 2
