"""Cost of one rank's data plan by dataset size: the per-position permutation (today's plan) next to
the whole-epoch ``randperm().tolist()`` it replaced, each in a fresh process, in one run.

    python bench/data_plan.py [--sizes 1e4 1e6 1e8] [--global-batch 1024] [--ranks 2] [--steps 200]

"first step" is the time from building the plan to rank 0's first StepPlan; "per step" the mean
over the next ``steps`` steps; "growth" the peak RSS of that process over its ``import torch``
baseline. The old method is run only up to 1e7 samples (at 1e8 it needs ~4 GB per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import json, resource, sys, time
import torch
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
baseline = peak()
from trainer.data.batch_plan import GlobalBatchPlan
from trainer.runtime.seeding import derive_seed
n, batch, ranks, steps, method = int(float(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
plan = GlobalBatchPlan(n, batch // ranks, 1, ranks, seed=0)
started = time.perf_counter()
if method == "per position":
    stream = plan.rank_steps(0, 0)
    next(stream)
    first = time.perf_counter() - started
    started = time.perf_counter()
    done = sum(1 for _, _ in zip(range(steps), stream))
else:  # what every rank did before: the whole order as a list, then every step's indices of the epoch
    order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(0, "epoch", 0))).tolist()
    plans = [plan.layout(order[s * batch:(s + 1) * batch]) for s in range(plan.steps_per_epoch)]
    first = time.perf_counter() - started
    started = time.perf_counter()
    done = sum(1 for _, _ in zip(range(steps), plans))
print(json.dumps({"first": first, "per_step": (time.perf_counter() - started) / max(done, 1), "growth": peak() - baseline}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1e4", "1e6", "1e8"])
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; global batch {args.global_batch} on {args.ranks} ranks")
    print(f"{'samples':>10} {'method':>14} {'first step':>12} {'per step':>10} {'growth/rank':>12}")
    for size in args.sizes:
        for method in ("per position", "randperm list"):
            if method == "randperm list" and float(size) > 1e7:
                print(f"{size:>10} {method:>14} {'(skipped: ~4 GB per rank)':>36}")
                continue
            out = subprocess.run([sys.executable, "-c", CHILD, size, str(args.global_batch), str(args.ranks),
                                  str(args.steps), method], capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": ROOT})
            r = json.loads(out.stdout)
            print(f"{size:>10} {method:>14} {r['first'] * 1e3:>10.1f}ms {r['per_step'] * 1e3:>8.2f}ms "
                  f"{r['growth'] / 2**20:>10.1f}MB")


if __name__ == "__main__":
    main()
