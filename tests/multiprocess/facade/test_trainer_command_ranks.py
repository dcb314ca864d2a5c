"""The ``trainer`` command under torchrun runs on every rank as ``train.py`` does: one run directory
(Hydra runs once, on rank 0), the same training as the command's own spawn of 2 workers."""

from __future__ import annotations

import sys

import pytest

from tests.support.command_line import (  # noqa: F401 (_kill_unfinished: an autouse fixture)
    FAST, _kill_unfinished, assert_ok, assert_same_losses, assert_six_steps, run, torchrun,
)
from tests.support.rank_exit import assert_ranks_ended_cleanly

pytestmark = pytest.mark.timeout(300)

DDP = ["strategy=ddp", "trainer.devices=2", "logger=[jsonl]"]


def test_torchrun_m_trainer_trains_as_the_commands_own_spawn(tmp_path):
    spawned = tmp_path / "spawn"
    assert_ok(run([sys.executable, "-m", "trainer"] + FAST + DDP + [f"hydra.run.dir={spawned}"]))
    parent = tmp_path / "torchrun"
    # Microseconds in the name: ranks that each ran Hydra would each create their own directory.
    result = run(torchrun(2) + ["-m", "trainer"] + FAST + DDP + [f"hydra.run.dir={parent}/${{now:%H-%M-%S-%f}}"])
    assert_ok(result)
    assert_ranks_ended_cleanly(result.stderr)
    (run_dir,) = parent.iterdir()
    assert "strategy ddp, world size 2" in result.output
    assert_same_losses(assert_six_steps(run_dir), assert_six_steps(spawned), rtol=1e-6)
