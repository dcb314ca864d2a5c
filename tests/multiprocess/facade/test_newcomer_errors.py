"""Ten bad inputs a newcomer types at ``python train.py``: each ends the run with a non-zero status,
within seconds and before any worker starts, with one line on stderr that names the bad value and
at least one value that is allowed; no traceback (``HYDRA_FULL_ERROR`` is taken out of the
environment by ``run``, so the caller's shell does not change the outcome)."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.command_line import _LAUNCHER_VARS, FAST, TRAIN, run
from tests.support.helpers import REPO

pytestmark = pytest.mark.timeout(300)

# Far below the collective timeout (1800 s): a bad input must not leave ranks waiting for each other.
WITHIN_S = 60

GPT = ["recipe=gpt", "trainer.max_steps=2", "trainer.progress_bar=false"]
# name: (command-line arguments, texts the one line must hold: the bad value and an allowed one). More values
# of the same kinds (impossible betas, a missing token directory, ...) are checked in process, in
# tests/unit/facade/test_one_line_errors.py.
BAD = {
    "mistyped group option": (FAST + ["strategy=fdsp"], ["strategy=fdsp", "did you mean strategy=fsdp?"]),
    "mistyped key": (FAST + ["trainer.max_step=10"], ["trainer.max_step=10", "did you mean trainer.max_steps=10?"]),
    "key without its group": (FAST + ["devices=2"], ["devices=2", "did you mean trainer.devices=2?"]),
    "negative learning rate": (FAST + ["optimizer.lr=-1"],
                               ["optimizer.lr=-1", "Invalid learning rate", "the default is lr=0.001"]),
    "negative learning rate under ddp": (FAST + ["strategy=ddp", "trainer.devices=2", "optimizer.lr=-1"],
                                         ["optimizer.lr=-1", "the default is lr=0.001"]),
    "missing data file": (GPT + ["data.path=nope"], ["data.path='nope'", "or null for the built-in text"]),
    "missing resume path": (FAST + ["trainer.resume=/no/such"], ["trainer.resume='/no/such'", "auto"]),
    "override syntax": (FAST + ["trainer.max_steps=[1"],
                        ["trainer.max_steps=[1:", "did you mean trainer.max_steps=[1]?"]),
    "option of another strategy": (FAST + ["strategy=ddp", "strategy.sharding=full"],
                                   ["strategy.sharding=full", "strategy=fsdp has it"]),
    "devices that do not divide the stages": (FAST + ["strategy=pipeline", "trainer.devices=3", "strategy.stages=2"],
                                              ["strategy.stages=2", "choose one of [1, 3]"]),
    "stages that do not divide the batch": (GPT + ["strategy=pipeline", "trainer.devices=3"],
                                            ["strategy.microbatches=null (the 3 stages)", "one of [4, 8, 16]"]),
    "fractional batch size": (FAST + ["data.batch_size=3.5"], ["got 3.5", "an integer >= 1"]),
    "batch size that is no number": (FAST + ["data.batch_size=abc"], ["got 'abc'", "an integer >= 1"]),
}


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    # Hermetic: run() starts each command without HYDRA_FULL_ERROR (a shell with it set would keep tracebacks).
    assert _LAUNCHER_VARS.fullmatch("HYDRA_FULL_ERROR")
    root = tmp_path_factory.mktemp("newcomer_errors")

    def one(item):
        index, (name, (arguments, _)) = item
        return name, run(TRAIN + arguments + [f"hydra.run.dir={root / str(index)}"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, enumerate(BAD.items())))


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_naming_the_value_and_what_is_allowed(name, bad_runs):
    result = bad_runs[name]
    assert result.returncode != 0, result.describe()
    assert "Traceback" not in result.output, result.describe()
    lines = result.stderr.rstrip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.describe()
    missing = [text for text in BAD[name][1] if text not in lines[0]]
    assert not missing, (missing, lines[0])
    assert result.seconds < WITHIN_S, result.describe()
    assert not result.leftovers, result.leftovers


def test_full_error_keeps_hydras_report(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["HYDRA_FULL_ERROR"] = "1"
    done = subprocess.run(TRAIN + FAST + ["trainer.max_step=10", f"hydra.run.dir={tmp_path}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "Key 'max_step' is not in struct" in done.stderr, done.stderr[-3000:]
    assert "error: trainer.max_step=10" not in done.stderr
