"""``train.py`` launched for real: torchrun vs self-spawn, multirun, two "nodes" on one machine,
the legacy launcher (bad input and a dead rank: test_launch_errors.py).

Every run is a subprocess (a few seconds each: the mlp recipe for 6 steps) with a timeout; its
process group is killed on timeout, and a marker in its environment finds any process it left
behind. Runs that several tests look at are module-scoped fixtures, so each is made once.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.support.command_line import (  # noqa: F401 (_kill_unfinished: an autouse fixture)
    FAST, TORCHRUN, TRAIN, Started, _kill_unfinished, assert_ok, assert_same_losses, assert_six_steps, free_port, run,
    torchrun,
)
from tests.support.rank_exit import assert_ranks_ended_cleanly

pytestmark = pytest.mark.timeout(300)


# ----- 1. torchrun and self-spawn: same training, one run directory ------------------------------------
@pytest.fixture(scope="module")
def spawn_ddp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("launch") / "spawn"
    result = run(TRAIN + FAST + ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={run_dir}"])
    assert_ok(result)
    return run_dir, assert_six_steps(run_dir)


@pytest.fixture(scope="module")
def torchrun_ddp(tmp_path_factory):
    parent = tmp_path_factory.mktemp("launch") / "tr"
    # Microseconds in the name: ranks that each ran Hydra would each create their own directory.
    result = run(torchrun(2) + ["train.py"] + FAST + ["strategy=ddp", "trainer.devices=2",
                                                      f"hydra.run.dir={parent}/${{now:%H-%M-%S-%f}}"])
    return parent, result


def test_torchrun_makes_one_run_directory(torchrun_ddp):
    parent, result = torchrun_ddp
    assert_ok(result)
    assert_ranks_ended_cleanly(result.stderr)  # (the ranks end with sys.exit: no abort, group released)
    created = sorted(os.listdir(parent))
    assert len(created) == 1, f"expected one run directory under {parent}, got {created}"
    assert re.fullmatch(r"\d\d-\d\d-\d\d-\d{6}", created[0]), created
    run_dir = parent / created[0]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert_six_steps(run_dir)


def test_torchrun_equals_self_spawn(torchrun_ddp, spawn_ddp):
    parent, result = torchrun_ddp
    assert_ok(result)
    (run_dir,) = parent.iterdir()
    _, spawn_losses = spawn_ddp
    assert_same_losses(assert_six_steps(run_dir), spawn_losses, rtol=1e-6)


# ----- 2. multirun with devices=2 ----------------------------------------------------------------------
MULTIRUN = ["-m"] + FAST + ["strategy=single,ddp", "trainer.devices=2"]


def test_multirun_self_spawn(tmp_path, spawn_ddp):
    sweep = tmp_path / "sweep"
    assert_ok(run(TRAIN + MULTIRUN + [f"hydra.sweep.dir={sweep}"]))
    single, ddp = assert_six_steps(sweep / "0"), assert_six_steps(sweep / "1")
    assert "strategy=single" in (sweep / "0" / ".hydra" / "overrides.yaml").read_text()
    assert_same_losses(ddp, spawn_ddp[1], rtol=1e-6)  # the ddp job really ran on 2 ranks
    assert single != ddp  # and the single job on one (global batch 32, not 64)


@pytest.fixture(scope="module")
def torchrun_multirun(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("launch") / "sweep_tr"
    return sweep, run(torchrun(2) + ["train.py"] + MULTIRUN + [f"hydra.sweep.dir={sweep}"])


def test_multirun_under_torchrun_runs_every_job(torchrun_multirun, spawn_ddp):
    # Job 0 (strategy=single under torchrun) is refused (see the next test); that must not hang
    # the sweep or the other ranks (it used to: rank 1 died in job 0 while rank 0 went on), and job 1 must train.
    sweep, result = torchrun_multirun
    assert not result.leftovers, result.leftovers
    assert_same_losses(assert_six_steps(sweep / "1"), spawn_ddp[1], rtol=1e-6)


def test_multirun_under_torchrun_refuses_single_with_a_clear_error(torchrun_multirun):
    # Under torchrun the launcher already started 2 processes, so a one-process strategy cannot
    # use them: job 0 (strategy=single) must fail with a message naming both counts (self-spawn
    # instead runs it on one process with a warning, as nothing was started yet).
    sweep, result = torchrun_multirun
    assert result.returncode != 0
    assert "started 2 processes but trainer.devices=1" in result.output
    assert_six_steps(sweep / "1")


# ----- 3. two "nodes" on one machine -------------------------------------------------------------------
def test_two_nodes_on_one_machine(tmp_path):
    port = free_port()
    run_dir = tmp_path / "nodes"
    nodes = [
        Started(TORCHRUN + ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node), "--master_addr",
                            "127.0.0.1", "--master_port", str(port), "train.py"] + FAST
                + ["strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2", "data.batch_size=32",
                   f"hydra.run.dir={run_dir}"])
        for node in (0, 1)
    ]
    # One process with the same global batch (64), meanwhile: it only starts when a core is free.
    reference = Started(TRAIN + FAST + ["data.batch_size=64", f"hydra.run.dir={tmp_path / 'b64'}"])
    for node in nodes:
        assert_ok(node.finish())
    assert_ok(reference.finish())
    assert_same_losses(assert_six_steps(run_dir), assert_six_steps(tmp_path / "b64"), rtol=1e-5)


# ----- 4. the legacy launcher --------------------------------------------------------------------------
def test_legacy_launcher_local_rank_argument(tmp_path, spawn_ddp):
    # python -m torch.distributed.launch passes --local-rank=N to the script (no --use-env).
    run_dir = tmp_path / "legacy"
    result = run([sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node", "2", "--master_addr",
                  "127.0.0.1", "--master_port", str(free_port()), "train.py"] + FAST
                 + ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={run_dir}"])
    assert_ok(result)
    assert_same_losses(assert_six_steps(run_dir), spawn_ddp[1], rtol=1e-6)
