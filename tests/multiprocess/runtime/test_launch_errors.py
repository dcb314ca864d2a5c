"""``train.py`` launched for real, given bad input or losing a rank: the error is clear, names the bad
value, comes before any worker starts where it can, and no process is left behind.

Shares test_launch_cli.py's runner (a subprocess with a timeout, its process group killed on timeout,
a marker in its environment to find any process it left behind).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.support.helpers import REPO, read_metrics
from tests.support.command_line import FAST, TORCHRUN, TRAIN, Started, _kill_unfinished, free_port, run  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(300)


# ----- 5. bad input -------------------------------------------------------------------------------------
BAD_INPUT = {
    "unknown strategy": (["strategy=nope"], ["no strategy option nope", "ddp, fsdp"]),
    "unknown recipe": (["recipe=nope"], ["no recipe option nope", "mlp"]),
    "misspelt key": (["trainer.max_stepz=5"], ["trainer.max_stepz"]),
    "no devices": (["trainer.devices=0"], ["trainer.devices", "got 0"]),
    "no accumulation": (["trainer.accumulate_grad_batches=0"], ["trainer.accumulate_grad_batches", "got 0"]),
    "empty batch": (["data.batch_size=0"], ["data.batch_size", "got 0"]),
    "global batch not a multiple": (["data.global_batch_size=30", "strategy=ddp", "trainer.devices=2"],
                                    ["data.global_batch_size=30", "64"]),
    "missing data file": (["recipe=gpt", "data.path=/no/such/file.txt"], ["/no/such/file.txt"]),
    "unknown sharding": (["strategy=fsdp", "strategy.sharding=zero3", "trainer.devices=2"],
                         ["strategy.sharding='zero3'", "full, grad_op, no_shard, hybrid"]),
    "shard size not dividing": (["strategy=fsdp", "strategy.sharding=hybrid", "strategy.shard_size=3", "trainer.devices=4"],
                                ["strategy.shard_size=3", "world size 4"]),
    "offload on cpu": (["strategy=fsdp", "strategy.cpu_offload=true", "trainer.devices=2", "trainer.accelerator=cpu"],
                       ["strategy.cpu_offload=true needs a CUDA device"]),
}


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")

    def one(item):
        index, (name, (overrides, _)) = item
        base = [a for a in FAST if not (a.startswith("recipe=") and any(o.startswith("recipe=") for o in overrides))]
        run_dir = root / str(index)
        return name, (run_dir, run(TRAIN + base + overrides + [f"hydra.run.dir={run_dir}"]))

    # Two at a time: each is one process, mostly Python start-up.
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, enumerate(BAD_INPUT.items())))


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_fails_fast_and_names_it(name, bad_input_runs):
    run_dir, result = bad_input_runs[name]
    expected = BAD_INPUT[name][1]
    assert result.returncode != 0, result.describe()
    for text in expected:
        assert text in result.output, f"{text!r} not in the output\n{result.describe()}"
    assert len(result.stderr.splitlines()) <= 40, f"error is not short\n{result.describe()}"
    # Nothing was trained and no worker started.
    assert not (run_dir / "metrics.jsonl").exists()
    assert "rank 1" not in result.output, result.describe()
    assert result.seconds < 20, result.describe()
    assert not result.leftovers, result.leftovers


def test_bad_input_on_one_node_only_fails_every_rank(tmp_path):
    # A relative data.path that exists on node 0 but not on node 1: rank 1 cannot build the job
    # while rank 0 can. All ranks must give up together, and rank 0 must say which rank failed and
    # why (this used to hang: rank 0 went on into training while rank 1 waited to tear down).
    port = free_port()
    for node in ("a", "b"):
        (tmp_path / node).mkdir()
    (tmp_path / "a" / "text.txt").write_text("some text to train on\n" * 100)
    nodes = [
        Started(TORCHRUN + ["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank), "--master_addr",
                            "127.0.0.1", "--master_port", str(port), os.path.join(REPO, "train.py"), "recipe=gpt",
                            "data.path=text.txt", "strategy=ddp", "trainer.num_nodes=2", "trainer.max_steps=6",
                            f"hydra.run.dir={tmp_path / 'run'}"],
                cwd=tmp_path / node)
        for rank, node in enumerate("ab")
    ]
    node0, node1 = (node.finish() for node in nodes)
    for result in (node0, node1):
        assert result.returncode != 0, result.describe()
        assert result.seconds < 30, result.describe()
        assert not result.leftovers, result.leftovers
    assert "rank 1: " in node0.output and "data.path='text.txt' is not a file" in node0.output, node0.describe()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ----- 6. a rank that dies ------------------------------------------------------------------------------
DYING_SCRIPT = """
    import os
    import sys

    sys.path.insert(0, {tests!r})

    import torch.distributed as dist

    from tests.support.helpers import Regressor
    from trainer import Trainer


    class DyingRegressor(Regressor):
        # Rank 1 dies without a word (no exception, no clean-up) in its third training step.
        def training_step(self, batch, batch_idx):
            if dist.get_rank() == 1 and batch_idx == 2:
                os._exit(3)
            return super().training_step(batch, batch_idx)


    if __name__ == "__main__":
        Trainer(strategy="ddp", devices=2, max_steps=50, batch_size=8, log_every_n_steps=1, loggers=["jsonl"],
                progress_bar=False, collective_timeout_s=30, run_dir={run_dir!r}).fit(DyingRegressor())
"""


def test_dead_rank_ends_the_job_and_is_named(tmp_path):
    script = tmp_path / "dying.py"
    script.write_text(textwrap.dedent(DYING_SCRIPT.format(tests=REPO,
                                                          run_dir=str(tmp_path / "run"))))
    result = run([sys.executable, str(script)])
    assert result.returncode != 0, result.describe()
    assert "rank 1" in result.output and "exited with code 3" in result.output, result.describe()
    # Well before collective_timeout_s: the launcher saw the death, nobody waited for the dead rank.
    assert result.seconds < 30, result.describe()
    assert not result.leftovers, result.leftovers
    steps = [r["step"] for r in read_metrics(str(tmp_path / "run"))]
    assert steps == [1, 2], steps  # it died in step 3


def test_spawning_from_stdin_with_a_main_module_is_a_clear_error(tmp_path):
    # Workers re-import __main__'s classes from the script file; a program read from stdin has none.
    script = textwrap.dedent(f"""
        import torch
        from torch.utils.data import TensorDataset
        from trainer import Trainer, TrainModule

        class StdinModule(TrainModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).pow(2).mean()

            def train_dataset(self):
                return TensorDataset(torch.randn(8, 2))

        Trainer(strategy="ddp", devices=2, max_steps=1, run_dir={str(tmp_path)!r}, progress_bar=False).fit(StdinModule())
    """)
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode != 0
    assert "no script file to import them from" in done.stderr and "FileNotFoundError" not in done.stderr
