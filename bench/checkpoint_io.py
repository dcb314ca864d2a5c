"""Checkpoint save / load throughput: plain torch.save vs the trainer's full, sharded and async
saves, in one process and on 2 FSDP ranks, in one run.

    python bench/checkpoint_io.py [--width 2560] [--layers 12] [--dir /tmp/ckpt-bench]

The model is ``layers`` Linear(width, width) blocks (default 78.7 M parameters, 315 MB of fp32
weights); the checkpoint also holds AdamW's two moments, so about 0.94 GB per save. Throughput
is checkpoint bytes / wall time (GB/s). For async saves, "blocked" is the time training waits
(staging to CPU memory) and "total" until the checkpoint is committed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import timedelta

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.checkpoint import CheckpointConfig, CheckpointManager, RunStates  # noqa: E402
from trainer.checkpoint.manager import load_training_state  # noqa: E402
from trainer.checkpoint.layout import find_latest  # noqa: E402


def build(width: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def take_a_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Allocate the optimizer state (what a real checkpoint holds)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    from trainer.runtime.memory import training_state_bytes

    counts = training_state_bytes(model, optimizer)
    return counts["parameters"] + counts["optimizer"]


def run_object(model, optimizer) -> RunStates:
    return RunStates(model=model, optimizer=optimizer, progress=lambda: {"step": 1, "epoch": 0, "epoch_step": 1})


def timed_save(root: str, model, optimizer, fmt: str, async_save: bool) -> tuple[float, float]:
    """(seconds training is blocked, seconds until committed)."""
    shutil.rmtree(root, ignore_errors=True)
    manager = CheckpointManager(CheckpointConfig(dir=root, format=fmt, async_save=async_save, save_on_signal=False), root)
    manager.setup()
    start = time.perf_counter()
    manager.save(run_object(model, optimizer))
    blocked = time.perf_counter() - start
    getattr(manager, "finish", manager.wait)()  # committed too (finish: the commit runs in a thread)
    total = time.perf_counter() - start
    manager.close(clean=True)
    return blocked, total


def timed_load(root: str, model, optimizer, fmt: str) -> float:
    from trainer.runtime import distributed

    distributed.barrier()
    start = time.perf_counter()
    load_training_state(find_latest(root), model, optimizer, fmt)
    distributed.barrier()
    return time.perf_counter() - start


def one_process(width: int, layers: int, folder: str) -> list[tuple[str, float, float, float]]:
    model, optimizer = build(width, layers)
    take_a_step(model, optimizer)
    size = state_bytes(model, optimizer)
    rows = []
    path = os.path.join(folder, "plain.pt")
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    start = time.perf_counter()
    torch.save(state, path)
    os.sync()
    saved = time.perf_counter() - start
    start = time.perf_counter()
    torch.load(path, weights_only=True)
    loaded = time.perf_counter() - start
    rows.append(("torch.save / torch.load (same bytes)", size / saved, size / saved, size / loaded))
    for fmt, async_save in (("full", False), ("sharded", False), ("sharded", True)):
        root = os.path.join(folder, f"{fmt}-{async_save}")
        blocked, total = timed_save(root, model, optimizer, fmt, async_save)
        load = timed_load(root, model, optimizer, fmt)
        rows.append((f"trainer {fmt}{' async' if async_save else ''}, 1 process", size / blocked, size / total, size / load))
    return rows, size


def two_ranks_worker(width: int, layers: int, folder: str) -> list:
    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment
    from trainer.strategies.fsdp import FSDPStrategy

    strategy = FSDPStrategy(accelerator="cpu", wrap=["Linear"])
    strategy.setup_environment(detect_environment(), timedelta(minutes=10))
    model, _ = build(width, layers)
    wrapped = strategy.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    take_a_step(model, optimizer)
    rows = []
    for fmt, async_save in (("full", False), ("sharded", False), ("sharded", True)):
        root = os.path.join(folder, f"fsdp-{fmt}-{async_save}")
        blocked, total = timed_save(root, model, optimizer, fmt, async_save)
        load = timed_load(root, model, optimizer, fmt)
        rows.append((f"trainer {fmt}{' async' if async_save else ''}, FSDP 2 ranks", blocked, total, load))
    del wrapped
    strategy.teardown(clean=True)
    return rows if distributed.rank() == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2560)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="ckpt-bench-")
    os.makedirs(folder, exist_ok=True)
    try:
        rows, size = one_process(args.width, args.layers, folder)
        from trainer.runtime.launch import spawn

        fsdp = spawn(two_ranks_worker, (args.width, args.layers, folder), nprocs=2, timeout=timedelta(minutes=10))
        rows += [(name, size / blocked, size / total, size / load) for name, blocked, total, load in fsdp]
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{platform.node()}  {platform.processor() or platform.machine()}  {os.cpu_count()} cores  "
          f"torch {torch.__version__}  {time.strftime('%Y-%m-%d')}")
    print(f"checkpoint: {size / 1e9:.2f} GB (weights + AdamW state), written to {folder}")
    print(f"{'':45s} {'save GB/s':>10s} {'(blocked)':>10s} {'load GB/s':>10s}")
    for name, blocked, total, load in rows:
        print(f"{name:45s} {total / 1e9:10.2f} {blocked / 1e9:10.2f} {load / 1e9:10.2f}")
    print("save GB/s: bytes / time until committed; (blocked): bytes / time training waited.")


if __name__ == "__main__":
    main()
