"""ZeRO-1 checkpoints: each rank saves and loads only the optimizer state it owns.

Memory is measured with the profiler's allocation records (``profile_memory=True``): every CPU
tensor allocation and free during the save (or load) on that rank, in time order; the peak of their
running sum is what the save held beyond what the rank held before it (its own shard included).
That covers the tensors an object collective pickles and unpickles, so the old consolidation (the
full state broadcast to every rank) shows up in it.
"""

import json
import os
import socket
from functools import partial

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.support.helpers import CheckpointedRegressor, fit
from tests.multiprocess.checkpoint.test_checkpoint import EVERY, STEPS, TOL, checkpointed, per_step_losses
from trainer.checkpoint import CheckpointConfig, CheckpointManager, RunStates, layout
from trainer.checkpoint.manager import load_training_state
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(300)
WIDTH = 512  # 1 MiB per weight: the largest optimizer-state tensor (exp_avg / exp_avg_sq of a weight)
LAYERS = 4  # AdamW state: 8 MiB in all, 4 MiB per rank on 2 ranks
SLACK = 128 * 1024  # what a save allocates besides optimizer state (DCP plans, metadata, RNG file)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _zero1(lr=1e-3):
    """A model, its ZeRO-1 optimizer (through the strategy) and DDP wrapper, on this rank."""
    from torch.nn.parallel import DistributedDataParallel

    model, strategy = _model(), DDPStrategy(zero1=True)
    optimizer = strategy.setup_optimizer(torch.optim.AdamW(model.parameters(), lr=lr))
    return model, strategy, optimizer, DistributedDataParallel(model)


def _peak_allocated(action):
    """Run ``action``; the peak of CPU tensor bytes it held at once beyond what existed before."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        action()
    events = []

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
                events.append((node.start_time_ns, node.extra_fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    held = peak = 0
    for _, size in sorted(events):
        held += size
        peak = max(peak, held)
    return peak


def _state_bytes(optimizer):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


def _worker(rank, port, root, fmt):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model, strategy, optimizer, wrapped = _zero1()
        zero = strategy._zero_optimizer
        generator = torch.Generator().manual_seed(rank)
        for _ in range(2):
            wrapped(torch.randn(8, WIDTH, generator=generator)).square().mean().backward()
            strategy.optimizer_step(optimizer)
            optimizer.zero_grad()
        manager = CheckpointManager(CheckpointConfig(dir=root, format=fmt, save_on_signal=False), root, strategy)
        manager.setup()
        run = RunStates(model=model, optimizer=optimizer, progress=lambda: {"step": 2, "epoch": 0, "epoch_step": 2})
        report = {"shard": _state_bytes(zero.optim), "user_optimizer_after_save": 0}
        report["save_peak"] = _peak_allocated(lambda: manager.save(run))
        report["user_optimizer_after_save"] = _state_bytes(optimizer)  # the old hooks left the full state there
        # Rank 0 commits in a background thread: the other rank may only look for `latest` after it landed.
        manager.finish()
        dist.barrier()
        names = {p: n for n, p in model.named_parameters()}
        torch.save({names[p]: dict(s) for p, s in zero.optim.state.items()}, os.path.join(root, f"owned{rank}.pt"))
        # Load into a fresh model and optimizer (another learning rate: the checkpoint's must win).
        fresh, fresh_strategy, fresh_optimizer, _ = _zero1(lr=0.5)
        path = layout.find_latest(root)
        load = partial(load_training_state, path, fresh, fresh_optimizer, fmt, strategy=fresh_strategy)
        report["load_peak"] = _peak_allocated(load)
        fresh_zero = fresh_strategy._zero_optimizer
        fresh_names = {p: n for n, p in fresh.named_parameters()}
        loaded = {fresh_names[p]: s for p, s in fresh_zero.optim.state.items()}
        report["load_exact"] = sorted(loaded) == sorted(names[p] for p in zero.optim.state) and all(
            torch.equal(loaded[names[p]][k], v) for p, s in zero.optim.state.items() for k, v in s.items())
        report["lr"] = [fresh_optimizer.param_groups[0]["lr"], fresh_zero.optim.param_groups[0]["lr"]]
        # The scheduler writes the learning rate into the user's group dicts: ZeRO must still read those.
        report["groups_shared"] = all(a is b for a, b in zip(fresh_zero.param_groups, fresh_optimizer.param_groups))
        report["user_optimizer_after_load"] = _state_bytes(fresh_optimizer)
        with open(os.path.join(root, f"report{rank}.json"), "w") as handle:
            json.dump(report, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_zero1_save_and_load_hold_one_shard_plus_one_tensor(tmp_path, fmt):
    torch.multiprocessing.start_processes(_worker, args=(_free_port(), str(tmp_path), fmt), nprocs=2,
                                        start_method="forkserver")  # forked from the session's warm server (conftest.py)
    reports = [json.loads((tmp_path / f"report{r}.json").read_text()) for r in range(2)]
    one_tensor = WIDTH * WIDTH * 4
    full_state = sum(r["shard"] for r in reports)
    params = list(_model().parameters())
    assert full_state == sum(2 * 4 * p.numel() + 4 for p in params)  # AdamW: exp_avg, exp_avg_sq, step
    model_bytes = sum(4 * p.numel() for p in params)
    for rank, report in enumerate(reports):
        print(f"{fmt} rank {rank}: shard {report['shard']} B, save peak {report['save_peak']} B, "
              f"load peak {report['load_peak']} B, one tensor {one_tensor} B")
        assert 0.4 * full_state < report["shard"] < 0.6 * full_state  # really sharded
        assert report["user_optimizer_after_save"] == report["user_optimizer_after_load"] == 0
        # A save adds at most one tensor to what the rank holds (its own shard): rank 0 of the full
        # format excepted, which receives the others' state to write one file.
        limit = one_tensor + SLACK + (full_state - report["shard"] if fmt == "full" and rank == 0 else 0)
        assert report["save_peak"] <= limit, (rank, report)
        # A load into a fresh optimizer allocates this rank's shard (there was none) by stepping one
        # parameter at a time (its zero gradient and the step's two temporaries: 3 tensors), then
        # reads tensors one by one. Full format: rank 0 reads the whole file (model and optimizer),
        # and torch's full model load broadcasts the whole model (which DDP replicates anyway).
        extra = model_bytes + (full_state if rank == 0 else 0) if fmt == "full" else 0
        limit = report["shard"] + 3 * one_tensor + SLACK + extra
        assert report["load_peak"] <= limit, (rank, report)
        assert report["load_exact"], rank
        assert report["lr"] == [1e-3, 1e-3] and report["groups_shared"]
    # The same checkpoint in one process: every parameter's state, keyed by name, equal to its owner's.
    owned = {**torch.load(tmp_path / "owned0.pt"), **torch.load(tmp_path / "owned1.pt")}
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    load_training_state(layout.find_latest(str(tmp_path)), model, optimizer, fmt)
    names = {p: n for n, p in model.named_parameters()}
    assert sorted(names[p] for p in optimizer.state) == sorted(owned)
    for param, state in optimizer.state.items():
        for key, value in owned[names[param]].items():
            assert torch.equal(state[key], value), (names[param], key)
    assert optimizer.param_groups[0]["lr"] == 1e-3


# ----- through the trainer: ZeRO-1 checkpoints continue on other strategies and world sizes ------------------
@pytest.fixture(scope="module")
def zero1_saves(tmp_path_factory):
    """An uninterrupted 2-rank DDP run without dropout, and 2-rank ZeRO-1 runs of it saved at step 6
    in both formats."""
    root = tmp_path_factory.mktemp("zero1")
    module = lambda: CheckpointedRegressor(dropout=0.0)  # noqa: E731
    reference = checkpointed(root / "whole", "ddp", module=module())
    for fmt in ("sharded", "full"):
        checkpointed(root / fmt, "zero1", module=module(), max_steps=6,
                     checkpoint=dict(every_n_steps=EVERY, keep_last=None, format=fmt))
    return module, reference, root


@pytest.mark.parametrize("fmt, target", [("sharded", "single"), ("sharded", "zero1_4"), ("full", "single"),
                                         ("full", "fsdp")])
def test_zero1_checkpoint_resumes_elsewhere(tmp_path, zero1_saves, fmt, target):
    module, (reference_losses, reference_params), root = zero1_saves
    args = {
        "single": dict(strategy="single", devices=1, batch_size=16),
        "zero1_4": dict(strategy=DDPStrategy(zero1=True), devices=4, batch_size=4),
        "fsdp": dict(strategy=FSDPStrategy(), devices=2, batch_size=8),
    }[target]
    losses, params = fit(tmp_path, module(), **args, max_steps=STEPS, resume=str(root / fmt / "checkpoints"),
                         checkpoint=dict(format=fmt, save_last=False))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[6:]), **TOL)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def test_zero1_async_save_resumes_with_the_learning_rate_schedule(tmp_path):
    # A scheduler writes the learning rate into the user's param groups; after a resume ZeRO-1 must
    # still read it from there (the step-8 decay happens after the step-6 checkpoint).
    def module():
        regressor = CheckpointedRegressor()
        regressor.scheduler_factory = partial(torch.optim.lr_scheduler.StepLR, step_size=4, gamma=0.5)
        return regressor

    whole, whole_params = checkpointed(tmp_path / "whole", "zero1", module=module(), max_steps=12)
    # Saved in the background (DCP copies each rank's own entries before training goes on).
    checkpointed(tmp_path / "resumed", "zero1", module=module(), max_steps=6,
                 checkpoint=dict(every_n_steps=EVERY, keep_last=None, async_save=True))
    _, resumed_params = checkpointed(tmp_path / "resumed", "zero1", module=module(), max_steps=12, resume="auto")
    resumed = per_step_losses(tmp_path / "resumed")
    assert [resumed[s] for s in range(1, 13)] == whole  # bitwise: same world size, generators restored
    for name, value in whole_params.items():
        assert torch.equal(resumed_params[name], value), name
