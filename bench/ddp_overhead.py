"""A 2-rank DDP run, start to end: a hand-written ``mp.spawn`` loop, this trainer, Lightning, side by side.

    python bench/ddp_overhead.py [--steps 10] [--long-steps 1500] [--pairs 5] [--long-pairs 1] [--no-lightning]

Each contender trains the same small GPT (recipes/gpt.py) with AdamW on 2 spawned CPU processes
(gloo), batch 16 per rank, no validation, no checkpoints, metrics logged every 50 steps. Every call is
made from this process, so each contender pays for starting its workers, as a user's script would.
Times (medians over ``--pairs`` rounds, contenders interleaved so machine noise hits all alike):

- start-up: from the ``fit`` call (or ``mp.spawn``) to rank 0's first training step;
- steps: rank 0's first step to its last step's end;
- end: from the last step's end until the call returns in this process;
- total, and its ratio to the hand-written loop;
- steps cpu: rank 0's CPU time (all its threads) over the steps, and its ratio to the hand-written
  loop's: on a machine shared with other work, wall-clock steps stretch with the load, CPU time much less.

``--long-steps`` runs one more round at that many steps: the whole run's ratio (the DDP overhead).
The figures go to ``--out`` (bench/_results.py's format; ``results``: {"short" | "long": {"steps", "pairs",
"median": {contender: {"start-up", "steps", "end", "total", "steps cpu"} in seconds}, "runs": every
measurement}}).
Lightning (``strategy="ddp_spawn"``) is measured only if it is installed; it is a bench-only
dependency. Rank 0 writes its step times into a file (wall clock, shared by the processes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import tempfile
import time

import torch

from _results import Recorder

BATCH = 16
MODEL = dict(block_size=64, layers=2, heads=4, width=128, dropout=0.0)


def _read(stamps: str, key: str) -> tuple[float, float]:
    """(wall clock, rank 0's CPU time) written by ``stamp``."""
    with open(os.path.join(stamps, key)) as f:
        wall, cpu = f.read().split()
    return float(wall), float(cpu)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----- hand-written -------------------------------------------------------------------------------
def _hand_written_worker(rank: int, steps: int, port: int, stamps: str) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from _ddp_modules import stamp
    from trainer.recipes.gpt import GPT, GPTModule

    # Each worker its share of the cores, as torchrun, Lightning and this trainer do (2 x 2 spinning
    # threads on 2 cores make every step several times slower).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    module = GPTModule(**MODEL)
    model = DistributedDataParallel(GPT(vocab_size=256, **MODEL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = module.train_dataset()
    loader = DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset, seed=0))
    done = 0
    while done < steps:
        for inputs, targets in loader:
            if done == 0 and rank == 0:
                stamp(stamps, "first")
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done % 50 == 0:
                dist.all_reduce(loss.detach())  # the trainer reduces its metrics on logging steps too
            if done == steps:
                break
    if rank == 0:
        stamp(stamps, "last")
    # Free DDP (its reducer holds the group) before the group goes: a worker that returned with DDP
    # still in its locals once deadlocked here (the group's destructor joined a gloo thread that
    # waited for the GIL the destructor held), 2026-11-23.
    del model, optimizer
    dist.destroy_process_group()


def hand_written(steps: int, stamps: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_hand_written_worker, args=(steps, _free_port(), stamps), nprocs=2)


# ----- this trainer ------------------------------------------------------------------------------
def ours(steps: int, stamps: str) -> None:
    from functools import partial

    from _ddp_modules import TimedGPTModule
    from trainer import Trainer

    module = TimedGPTModule(stamps, optimizer=partial(torch.optim.AdamW, lr=1e-3), **MODEL)
    Trainer(strategy="ddp", devices=2, max_steps=steps, batch_size=BATCH, log_every_n_steps=50, loggers=["jsonl"],
            progress_bar=False, checkpoint=None, run_dir=os.path.join(stamps, "run")).fit(module)


# ----- Lightning -----------------------------------------------------------------------------------
def lightning(steps: int, stamps: str) -> None:
    import lightning as L
    from _lightning_gpt import LitGPT
    from torch.utils.data import DataLoader

    from trainer.recipes.gpt import GPTModule

    torch.manual_seed(0)
    loader = DataLoader(GPTModule(**MODEL).train_dataset(), batch_size=BATCH, shuffle=True)
    L.Trainer(max_steps=steps, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              log_every_n_steps=50, default_root_dir=stamps).fit(LitGPT(stamps, MODEL), loader)


def _lightning_installed() -> bool:
    try:
        import lightning  # noqa: F401
    except ImportError:
        return False
    return True


def measure(run, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as stamps:
        called = time.time()
        run(steps, stamps)
        returned = time.time()
        (first, first_cpu), (last, last_cpu) = _read(stamps, "first"), _read(stamps, "last")
    return {"start-up": first - called, "steps": last - first, "end": returned - last, "total": returned - called,
            "steps cpu": last_cpu - first_cpu}


def table(title: str, figures: dict[str, list[dict[str, float]]]) -> None:
    median = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in figures.items()}
    base = median["hand-written mp.spawn"]
    print(f"\n{title}")
    print(f"{'contender':<24}{'start-up s':>11}{'steps s':>9}{'end s':>8}{'total s':>9}{'vs loop':>9}"
          f"{'start-up +':>11}{'end +':>8}{'steps cpu s':>12}{'cpu vs loop':>12}")
    for name, m in median.items():
        print(f"{name:<24}{m['start-up']:>11.2f}{m['steps']:>9.2f}{m['end']:>8.2f}{m['total']:>9.2f}"
              f"{m['total'] / base['total']:>9.3f}{m['start-up'] - base['start-up']:>+11.2f}{m['end'] - base['end']:>+8.2f}"
              f"{m['steps cpu']:>12.2f}{m['steps cpu'] / base['steps cpu']:>12.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--long-steps", type=int, default=1500, help="0: skip the long round")
    parser.add_argument("--long-pairs", type=int, default=1)
    parser.add_argument("--json", help="also write the raw figures here")
    parser.add_argument("--out", help="the result file (default bench/results/ddp_overhead.json)")
    parser.add_argument("--no-lightning", action="store_true", help="leave Lightning out (a shorter run)")
    args = parser.parse_args()
    contenders = {"hand-written mp.spawn": hand_written, "trainer (this repo)": ours}
    if _lightning_installed() and not args.no_lightning:
        contenders["lightning ddp_spawn"] = lightning
    print(f"torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.2f} at start")
    if "lightning ddp_spawn" not in contenders:
        print("lightning: left out (--no-lightning)" if args.no_lightning else "lightning: not installed (pip install lightning)")
    raw: dict[str, dict[str, list]] = {}
    recorder = Recorder("ddp_overhead", {"ranks": 2, "model": f"GPT {MODEL['layers']}x{MODEL['width']}",
                                         "batch per rank": f"{BATCH}x{MODEL['block_size']}", "optimizer": "AdamW(lr=1e-3)",
                                         "figure": "median of pairs"}, args.out)
    summary = {}
    for label, steps, pairs in (("short", args.steps, args.pairs), ("long", args.long_steps, args.long_pairs)):
        if steps <= 0 or pairs <= 0:
            continue
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        for _ in range(pairs):
            for name, run in contenders.items():
                figures[name].append(measure(run, steps))
                print(f"  {steps} steps, {name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in figures[name][-1].items())
                      + f" (load average {os.getloadavg()[0]:.2f})", flush=True)
        raw[label] = figures
        summary[label] = {"steps": steps, "pairs": pairs, "runs": figures,
                          "median": {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                                     for name, runs in figures.items()}}
        table(f"{steps} steps, 2 ranks, GPT {MODEL['layers']}x{MODEL['width']}, batch {BATCH}x{MODEL['block_size']} "
              f"per rank, median of {pairs}; load average {os.getloadavg()[0]:.2f} after", figures)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    recorder.write(summary)


if __name__ == "__main__":
    main()
