"""What a checkpoint save costs the training ranks: the time from ``save()`` until the ranks meet
at their next collective (what the next step's gradient all-reduce would wait for), and the
collectives one save makes, on 2 FSDP ranks with sharded saves and ``keep_last=1`` (every save
after the first also deletes the previous checkpoint).

    python bench/checkpoint_commit.py [--width 1024] [--layers 8] [--saves 5] [--dir /tmp/ckpt-commit]

"critical path" is per save: ``save()`` plus one barrier after it, the slowest rank's, median over
the saves; "save() returns" is each rank's own median; "until committed" is rank 0's time until the
commit and retention of the last save are done (``wait()``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.checkpoint_io import build, run_object, state_bytes, take_a_step  # noqa: E402
from trainer.checkpoint import CheckpointConfig, CheckpointManager  # noqa: E402


def worker(width: int, layers: int, saves: int, folder: str) -> dict | None:
    from trainer.runtime import distributed
    from trainer.runtime.comms_log import CollectiveRecorder
    from trainer.runtime.launch import detect_environment
    from trainer.strategies.fsdp import FSDPStrategy

    strategy = FSDPStrategy(accelerator="cpu", wrap=["Linear"])
    strategy.setup_environment(detect_environment(), timedelta(minutes=10))
    model, _ = build(width, layers)
    wrapped = strategy.wrap(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    take_a_step(model, optimizer)
    size = state_bytes(model, optimizer)
    root = os.path.join(folder, "checkpoints")
    manager = CheckpointManager(CheckpointConfig(dir=root, keep_last=1, save_on_signal=False), root, strategy)
    manager.setup()
    returned, critical = [], []
    counts = {}
    for step in range(1, saves + 1):
        run = run_object(model, optimizer)
        run.step = step
        distributed.barrier()
        start = time.perf_counter()
        if step == saves:
            with CollectiveRecorder() as recorder:
                manager.save(run)
            counts = {kind: int(entry["count"]) for kind, entry in recorder.counts.items()}
        else:
            manager.save(run)
        returned.append(time.perf_counter() - start)
        distributed.barrier()  # the next collective training would make
        critical.append(time.perf_counter() - start)
    start = time.perf_counter()
    getattr(manager, "finish", manager.wait)()  # committed too (finish: the commit runs in a thread)
    committed = time.perf_counter() - start
    manager.close(clean=True)
    everyone = distributed.all_gather_object({"returned": statistics.median(returned), "critical": critical,
                                              "counts": counts})
    del wrapped
    strategy.teardown(clean=True)
    if distributed.rank() != 0:
        return None
    slowest = [max(report["critical"][i] for report in everyone) for i in range(saves)]
    return {"size": size, "critical": statistics.median(slowest), "returned": [r["returned"] for r in everyone],
            "committed_after_last": committed, "counts": [r["counts"] for r in everyone]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="ckpt-commit-")
    os.makedirs(folder, exist_ok=True)
    try:
        from trainer.runtime.launch import spawn

        result = spawn(worker, (args.width, args.layers, args.saves, folder), nprocs=2, timeout=timedelta(minutes=10))
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{platform.node()}  {platform.processor() or platform.machine()}  {os.cpu_count()} cores  "
          f"torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"FSDP 2 ranks, sharded, keep_last=1, {args.saves} saves of {result['size'] / 1e6:.0f} MB")
    print(f"critical path per save (save() + next collective, slowest rank, median): {result['critical'] * 1000:.0f} ms")
    print("save() returns (median) per rank: " + ", ".join(f"{t * 1000:.0f} ms" for t in result["returned"]))
    print(f"rank 0 wait() after the last save (commit + retention still running): {result['committed_after_last'] * 1000:.0f} ms")
    print("collectives of one save per rank: " + "; ".join(
        ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items())) for counts in result["counts"]))


if __name__ == "__main__":
    main()
