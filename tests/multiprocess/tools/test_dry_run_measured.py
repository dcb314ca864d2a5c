"""The dry run and the estimator's strategy=nd bytes against a real run, rank by rank.

A real run (``strategy=nd`` through the Trainer) of a small module with its own TP plan
(tests/support/tp_modules.py, uneven sizes: FSDP pads, torch.chunk leaves short pieces) and of the
llama recipe (its own plan) on gloo, tp 2 (2 ranks) and dp_shard 2 x tp 2 (4 ranks), and of the
llama recipe under ``strategy=pipeline`` with 2 stages x tp 2 (4 ranks: each keeps its stage),
measured after its first optimizer step (tests/support/dry_run_worker.py). The dry run's shards of
every rank equal the real ones' storage bytes, parameter by parameter (and, under TP alone, each
gradient's: the llama embedding's is whole on every tp rank, torch's Replicate gradient for a
row-split embedding); the estimator's per-rank
parameter, gradient and optimizer-state bytes equal ``training_state_bytes(..., allocated=True)``:
exact, as the figures are counted from the same layout, not approximated.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from hydra.utils import instantiate

from tests.support.dry_run_worker import LAYOUTS, MODULE, llama_config
from tests.support.helpers import REPO
from tests.support.tp_modules import TPRegressor
from trainer.estimate.dry_run import all_layouts
from trainer.estimate.model import build_fake, fake_mode, model_shapes
from trainer.estimate.nd_plan import layout_of, nd_row
from trainer.estimate.plan import Setting

#: how the dry run builds each module the runs fit
MODULES = {"tp_regressor": lambda: TPRegressor(**MODULE), "llama": lambda: instantiate(llama_config())}


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def measured(request, tmp_path_factory):
    """(layout name, {module: [each rank's measurement]}) of one real run."""
    name = request.param
    world, runs = LAYOUTS[name]
    run_dir = tmp_path_factory.mktemp(name)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), os.path.join(REPO, "tests", "support", "dry_run_worker.py"),
         str(run_dir), name],
        capture_output=True, text=True, cwd=REPO, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return name, {run: [json.loads((run_dir / run / f"rank{r}.json").read_text()) for r in range(world)]
                  for run, *_ in runs}


def _run(layout, run):
    """(the module's builder, the run's degrees, the dry run's options) of one run of a launch, read
    from the strategy's own options as the estimator reads them (nd_plan.layout_of)."""
    world, runs = LAYOUTS[layout]
    module, strategy, options = next(rest for name, *rest in runs if name == run)
    dims, layout_args = layout_of(strategy, options, world)
    return MODULES[module], dims, layout_args


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dry_runs_shards_are_the_real_runs_rank_by_rank(measured):
    name, runs = measured
    for run, ranks in runs.items():
        make, dims, layout_args = _run(name, run)
        layouts = all_layouts(make, dims, **layout_args)
        assert len(layouts) == len(ranks)
        for rank, (layout, real) in enumerate(zip(layouts, ranks)):
            assert {s.name: s.bytes for s in layout.shards} == real["shards"], (name, run, rank)
            if dims.dp == 1:  # without FSDP each gradient has its own storage (FSDP's are views of one buffer)
                assert {s.name: s.gradient_numel * s.element_size for s in layout.shards} == \
                    {n: nbytes for n, (_, nbytes) in real["grads"].items()}, (name, run, rank)
    make, dims, layout_args = _run(name, "tp_regressor")
    ranks, layouts = runs["tp_regressor"], all_layouts(make, dims, **layout_args)
    # What makes the comparison worth it: TP splits the blocks; FSDP pads (storage beyond the pieces).
    up = {s.name: s for s in layouts[0].shards}["blocks.0.up.weight"]
    assert up.global_shape == (10, 6) and up.local_shape == ((5, 6) if name == "tp2" else (3, 6))
    padded = sum(sum(r["shards"].values()) for r in ranks)
    pieces = sum(s.local_numel * s.element_size for layout in layouts for s in layout.shards)
    assert padded > pieces if name == "fsdp2_tp2" else padded == pieces


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_estimators_nd_bytes_are_the_measured_ones(measured):
    name, runs = measured
    for run, ranks in runs.items():
        make, dims, layout_args = _run(name, run)
        mode = fake_mode()
        module = build_fake(make, mode)
        shapes = model_shapes(module, mode)
        setting = Setting(world=len(ranks), devices_per_node=len(ranks), strategy="nd")
        row = nd_row("nd", make, dims, shapes, None, setting, layout=layout_args)
        for rank, (estimated, real) in enumerate(zip(row.ranks, ranks)):
            got = [estimated.parameters, estimated.gradients, estimated.optimizer]
            assert got == [real["state"][p] for p in ("parameters", "gradients", "optimizer")], (name, run, rank)
