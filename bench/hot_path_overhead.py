"""The trainer's whole-process cost against a hand-written loop (and Lightning), one process and DDP.

    python bench/hot_path_overhead.py [--steps 1500] [--pairs 5] [--warmup 1] [--ranks 1 2] [--no-lightning]
                                      [--out bench/results/hot_path_overhead.json] [--note TEXT]

On an idle machine (nothing else running) the defaults are the measurement: one process and 2 DDP
ranks, 1500 steps, a warm-up round then 5 pairs (about 12 minutes on 2 cores). A quick check that it
works: ``--steps 50 --pairs 1 --warmup 0 --out /tmp/check.json``.

Every contender trains the same MLP (64 -> 256 -> 256 -> 256 -> 10, ReLU) with AdamW (lr 1e-3) on the
same 96,000 random samples (a ``TensorDataset``), global batch 64 (32 per rank on 2 ranks), for ``--steps`` optimizer steps,
reporting the loss every 50 steps, with no validation:

- hand-written: a ``DataLoader`` with ``shuffle=True`` (``DistributedSampler`` and ``DistributedDataParallel``
  under ``mp.spawn`` on 2 ranks, each rank half the cores), forward, backward, ``step``, ``zero_grad``;
  ``loss.item()`` (all-reduced on 2 ranks) and a printed line every 50 steps;
- trainer: the defaults a user gets, ``Trainer(max_steps=..., batch_size=64 // ranks, log_every_n_steps=50,
  progress_bar=False)``: TensorBoard events, ``metrics.jsonl``, the model summary and a checkpoint at the
  end, in a temporary run directory; ``strategy="ddp", devices=2`` on 2 ranks (the trainer spawns its
  workers);
- trainer-no-loggers: the same with ``loggers=[], checkpoint=None, enable_model_summary=False``;
- Lightning (if installed; a bench-only dependency): ``L.Trainer(max_steps=..., logger=False,
  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)``, ``ddp_spawn``
  on 2 ranks, the module returning its loss (no ``self.log``).

Each run is a fresh ``python`` process (this file with ``--run``), timed from its start to its exit:
imports, set-up, the steps and the shutdown. After one warm-up round (not counted), each pair runs
the contenders one after the other (hand-written, trainer, Lightning: A B A B ...), and the ratio of
each contender to the hand-written run of the same pair is taken pair by pair, so a machine whose
speed drifts between pairs still gives fair ratios. It prints the median ratio with its min and max,
with the machine and date, and writes every figure to ``--out`` (JSON; its format is in
``write_result``). Quote figures measured on an idle machine only: nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOG_EVERY = 50
GLOBAL_BATCH = 64
CONTENDERS = ("hand-written", "trainer", "trainer-no-loggers", "lightning")


# ----- one run (a process of its own) ---------------------------------------------------------------------
def _hand_written_loop(steps: int, rank: int, ranks: int) -> None:
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    from _mlp_modules import adamw, dataset, mlp

    data = dataset()
    model = mlp()
    if ranks > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        sampler = DistributedSampler(data, num_replicas=ranks, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=GLOBAL_BATCH // ranks, sampler=sampler)
    else:
        sampler = None
        loader = DataLoader(data, batch_size=GLOBAL_BATCH, shuffle=True)
    optimizer = adamw(model.parameters())
    done, epoch = 0, 0
    while done < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done % LOG_EVERY == 0 or done == steps:
                reported = loss.detach()
                if ranks > 1:
                    dist.all_reduce(reported)
                    reported /= ranks
                if rank == 0:
                    print(f"step {done} loss {reported.item():.4f}", flush=True)
            if done == steps:
                break
        epoch += 1
    if ranks > 1:
        del model, optimizer  # DDP's reducer holds the group: free it before the group goes
        dist.destroy_process_group()


def _hand_written_worker(rank: int, steps: int, ranks: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    sys.path[:0] = [ROOT, HERE]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))  # as torchrun, Lightning and the trainer do
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    _hand_written_loop(steps, rank, ranks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_hand_written(steps: int, ranks: int) -> None:
    if ranks == 1:
        _hand_written_loop(steps, 0, 1)
        return
    import torch.multiprocessing as mp

    mp.spawn(_hand_written_worker, args=(steps, ranks, _free_port()), nprocs=ranks)


def run_trainer(steps: int, ranks: int, quiet: bool = False) -> None:
    """The defaults (``quiet``: no loggers, no checkpoint, no model summary)."""
    from _trainer_mlp import MLPModule
    from trainer import Trainer

    off = {"loggers": [], "checkpoint": None, "enable_model_summary": False} if quiet else {}
    with tempfile.TemporaryDirectory() as run_dir:
        Trainer(max_steps=steps, batch_size=GLOBAL_BATCH // ranks, log_every_n_steps=LOG_EVERY, progress_bar=False,
                run_dir=run_dir, **off, **({"strategy": "ddp", "devices": ranks} if ranks > 1 else {})).fit(MLPModule())


def run_trainer_no_loggers(steps: int, ranks: int) -> None:
    run_trainer(steps, ranks, quiet=True)


def run_lightning(steps: int, ranks: int) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from _lightning_mlp import LitMLP
    from _mlp_modules import dataset

    loader = DataLoader(dataset(), batch_size=GLOBAL_BATCH // ranks, shuffle=True)
    with tempfile.TemporaryDirectory() as root:
        L.Trainer(max_steps=steps, accelerator="cpu", devices=ranks, strategy="ddp_spawn" if ranks > 1 else "auto",
                  logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  log_every_n_steps=LOG_EVERY, default_root_dir=root).fit(LitMLP(), loader)


RUNS = {"hand-written": run_hand_written, "trainer": run_trainer, "trainer-no-loggers": run_trainer_no_loggers,
        "lightning": run_lightning}


# ----- timing whole processes ------------------------------------------------------------------------------
def timed_process(contender: str, steps: int, ranks: int) -> dict[str, float | None]:
    """One run of ``contender`` in a fresh process (bench/_paired_runs.py's ``run_once``): its wall time
    (start to exit), the CPU time of it and of every process it started, its largest resident set.
    A spawned gloo rank of the hand-written loop or of Lightning's ddp_spawn may abort at interpreter
    exit after its last step (a gloo thread left running: "terminate called without an active
    exception"); its training ran, so the run counts, with its exit code recorded. Any other failure
    stops the bench (the trainer must always exit 0)."""
    from _paired_runs import run_once

    command = [sys.executable, os.path.abspath(__file__), "--run", contender, "--steps", str(steps), "--ranks", str(ranks)]
    finished = {"hand-written": f"step {steps} loss", "lightning": f"max_steps={steps}` reached"}
    return run_once(command, ROOT, done_marker=finished.get(contender))


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(ranks: int, steps: int, pairs: int, warmup: int, contenders: list[str]) -> dict:
    """``warmup`` uncounted rounds, then ``pairs`` rounds of every contender in turn; the ratios
    to the hand-written run of each round."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for round_ in range(warmup + pairs):
        counted = round_ >= warmup
        for name in contenders:
            figures = timed_process(name, steps, ranks)
            if counted:
                runs[name].append(figures)
            cpu = "unknown" if figures["cpu_s"] is None else f"{figures['cpu_s']:.2f} s"
            print(f"  {ranks} rank(s), {'pair ' + str(round_ - warmup + 1) if counted else 'warm-up'}, {name}: "
                  f"wall {figures['wall_s']:.2f} s, cpu {cpu} (load average {os.getloadavg()[0]:.2f})", flush=True)
    base = runs["hand-written"]
    ratios = {}
    for name in contenders[1:]:
        wall = [r["wall_s"] / b["wall_s"] for r, b in zip(runs[name], base)]
        cpu = [r["cpu_s"] / b["cpu_s"] for r, b in zip(runs[name], base) if r["cpu_s"] and b["cpu_s"]]
        ratios[name] = {"wall": {"pairs": wall, **_spread(wall)},
                        "cpu": {"pairs": cpu, **_spread(cpu)} if len(cpu) == len(wall) else None}
    return {"ranks": ranks, "baseline": "hand-written", "runs": runs, "ratios": ratios}


def machine() -> dict:
    import torch

    try:
        import lightning

        lightning_version = lightning.__version__
    except ImportError:
        lightning_version = None
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "lightning": lightning_version}


def write_result(path: str, result: dict) -> None:
    """The result file: ``{"benchmark": "hot_path_overhead", "date": ISO UTC, "command": str,
    "machine": {platform, processor, cpu_count, python, torch, lightning (None: not installed)},
    "load_average": {"start", "end"}, "settings": {steps, pairs, warmup, model, optimizer,
    global_batch, samples, log_every_n_steps}, "results": [{"ranks": 1 | 2, "baseline": "hand-written",
    "runs": {contender: [{"wall_s", "cpu_s", "peak_rss_mb", "exit_code"} per pair]},
    "ratios": {contender: {"wall" | "cpu": {"pairs": [per pair], "median", "min", "max"}}}}], "note": str}``;
    a ratio is the contender's figure over the hand-written run's of the same pair; ``cpu_s`` and the
    cpu ratios are null where a run's processes could not all be reaped (see ``timed_process``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument("--no-lightning", action="store_true", help="leave Lightning out")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "hot_path_overhead.json"))
    parser.add_argument("--note", default="", help="written into the result file (e.g. what else ran)")
    parser.add_argument("--run", choices=CONTENDERS, help=argparse.SUPPRESS)  # one timed process
    args = parser.parse_args()
    for name, value, least in (("--steps", args.steps, 1), ("--pairs", args.pairs, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            parser.error(f"{name} must be >= {least}, got {value}")
    sys.path[:0] = [ROOT, HERE]
    if args.run is not None:
        RUNS[args.run](args.steps, args.ranks[0])
        return
    from _mlp_modules import SAMPLES

    info = machine()
    contenders = list(CONTENDERS if info["lightning"] is not None and not args.no_lightning else CONTENDERS[:3])
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = os.getloadavg()[0]
    print(f"{date}, {info['processor']}, {info['cpu_count']} cores, python {info['python']}, torch {info['torch']}, "
          f"lightning {info['lightning'] or 'not installed (pip install lightning)'}"
          f"{' (left out: --no-lightning)' if args.no_lightning and info['lightning'] else ''}; "
          f"load average {load_start:.2f} at start")
    print(f"MLP 64-256-256-256-10, AdamW, global batch {GLOBAL_BATCH}, {args.steps} steps, whole process, "
          f"{args.warmup} warm-up round(s) then {args.pairs} pair(s)")
    results = [measure(ranks, args.steps, args.pairs, args.warmup, contenders) for ranks in args.ranks]
    load_end = os.getloadavg()[0]
    print(f"\nratio to the hand-written loop (wall clock, whole process; median [min, max] of {args.pairs} pair(s)),"
          f" load average {load_end:.2f} at the end")
    for result in results:
        hand = statistics.median(r["wall_s"] for r in result["runs"]["hand-written"])
        line = f"  {result['ranks']} rank(s): hand-written {hand:.2f} s"
        for name, ratio in result["ratios"].items():
            wall, cpu = ratio["wall"], ratio["cpu"]
            line += (f"; {name} {wall['median']:.3f}x [{wall['min']:.3f}, {wall['max']:.3f}]"
                     f" (cpu {'unknown' if cpu is None else format(cpu['median'], '.3f') + 'x'})")
        print(line)
    write_result(args.out, {
        "benchmark": "hot_path_overhead", "date": date, "command": " ".join(["python", "bench/hot_path_overhead.py"] + sys.argv[1:]),
        "machine": info, "load_average": {"start": load_start, "end": load_end},
        "settings": {"steps": args.steps, "pairs": args.pairs, "warmup": args.warmup,
                     "model": "MLP 64-256-256-256-10 (ReLU)", "optimizer": "AdamW(lr=1e-3)",
                     "global_batch": GLOBAL_BATCH, "samples": SAMPLES, "log_every_n_steps": LOG_EVERY},
        "results": results, "note": args.note,
    })
    print(f"written: {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
