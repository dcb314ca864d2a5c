"""Measured pipeline bubble (idle fraction) of strategy=pipeline per schedule, next to theory.

    python bench/pipeline_bubble.py [--steps 10] [--warmup 3] [--width 512] [--schedules gpipe 1f1b ...]
                                    [--microbatches 2 4 8] [--quick] [--out bench/results/pipeline_bubble.json]

For each schedule (gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble; the last three with 2
virtual stages per rank) and m = 2, 4, 8 microbatches, the real Trainer trains 8 equal MLP blocks
on 2 CPU ranks (gloo, one thread each, p = 2 stages, uniform partition). Inside each worker the
rank's ``PipelineStage`` objects (``strategy.pipeline_stages``) are instrumented: busy time =
wall time inside ``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk``
(zero bubble's deferred weight gradient). The step's pipeline window runs from the last rank
entering ``schedule.step`` to the last one leaving it (the ranks share one clock); a rank's idle
fraction = 1 - busy / window, summed over the steps after the warm-up (the first step also infers
shapes). Idle is the bubble proper plus everything else that is not stage compute: waiting on
and posting the peer's sends / receives, the last stage's loss function, the schedule's own
Python. It should sit at or above (p-1)/(m+p-1), or (p-1)/(v*m+p-1) with v virtual stages per rank
(each row names its formula), and get closer to it as the compute per microbatch grows against
the fixed per-message costs (``--width``). "on-cpu" checks the machine was quiet: the share of
the compute calls' wall time that the rank's thread actually ran. Every row goes to ``--out``
(bench/_results.py's format; ``results`` is a list of ``{"schedule", "microbatches", "theory",
"formula", "ranks": [{"idle", "p2p", "other", "on_cpu", "step_ms"} per rank] or "refused": why}``;
``p2p``: the share of the window spent posting and waiting on the point-to-point sends and receives
(``torch.distributed.pipelining``'s batched p2p calls, timed the same way): the bubble itself, waiting
for the other stage, and the messages; ``other``: the rest of the idle time, the schedule's own Python
between calls and the last stage's loss). ``theory_measured_stages``: the formula with the stages'
measured compute put in (``uneven_theory``): equal stages are the formula's premise. ``--quick`` checks
that it runs (width 32, 1 measured step after 1 warm-up, m = 4, the result in a temporary file
unless ``--out`` is given): its figures mean nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import platform
import sys
import tempfile
import time
from functools import partial

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's trainer, not an installed one (spawned workers inherit sys.path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from trainer import TrainModule, Trainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _strategy_model import Block  # noqa: E402  (the same block as bench/strategy_baselines.py's)
from trainer.strategies.pipeline import SCHEDULES, PipelineStrategy  # noqa: E402

DEPTH, BATCH, STAGES = 8, 64, 2
MICROBATCHES = (2, 4, 8)
TIMED = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class BubbleModule(TrainModule):
    """DEPTH equal blocks (so a uniform partition gives balanced stages); times the pipeline."""

    def __init__(self, steps: int, width: int):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=1e-3))
        self.samples, self.width = steps * BATCH, width
        self.blocks = nn.ModuleList(Block(width) for _ in range(DEPTH))

    def train_dataset(self):
        generator = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(self.samples, self.width, generator=generator),
                             torch.randn(self.samples, self.width, generator=generator))

    def pipeline_layers(self):
        return list(self.blocks)

    def pipeline_loss(self, output, batch):
        return F.mse_loss(output, batch[1])

    def configure_model(self):  # runs in the worker, before the strategy wraps the model
        torch.set_num_threads(1)  # 2 ranks on 2 cores: one each
        logging.getLogger("trainer").setLevel(logging.WARNING)  # 15 runs' info lines would bury the table

    def on_fit_start(self):
        strategy = self.trainer.strategy
        self.busy, self.busy_cpu, self.p2p, self.depth, self.records = 0.0, 0.0, 0.0, 0, []
        for stage in strategy.pipeline_stages:
            for name in TIMED:
                setattr(stage, name, self._timed(getattr(stage, name)))
        from torch.distributed.pipelining import schedules

        for name in ("_batch_p2p", "_wait_batch_p2p"):  # module functions the schedules look up at call time
            if not hasattr(getattr(schedules, name), "timed_by_bench"):
                setattr(schedules, name, self._timed(getattr(schedules, name), "p2p"))
        step = strategy.schedule.step  # the strategy calls self.schedule.step: an instance attribute wins

        def timed_step(*args, **kwargs):
            self.busy = self.busy_cpu = self.p2p = 0.0
            start = time.perf_counter()
            result = step(*args, **kwargs)
            # perf_counter is CLOCK_MONOTONIC on Linux: one clock for all processes of the machine,
            # so the parent can line the ranks' steps up.
            self.records.append((start, time.perf_counter(), self.busy, self.busy_cpu, self.p2p))
            return result

        strategy.schedule.step = timed_step

    def _timed(self, method, into: str = "busy"):
        def wrapper(*args, **kwargs):
            if into == "p2p":
                start = time.perf_counter()
                try:
                    return method(*args, **kwargs)
                finally:
                    self.p2p += time.perf_counter() - start

            # Count only the outermost call, in case one timed method ever calls another.
            self.depth += 1
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.busy += time.perf_counter() - start
                    self.busy_cpu += time.thread_time() - start_cpu
        wrapper.timed_by_bench = True
        return wrapper

    def on_fit_end(self):
        rank = torch.distributed.get_rank()
        with open(os.path.join(self.trainer.run_dir, f"bubble_rank{rank}.json"), "w") as f:
            json.dump(self.records, f)


def measure(schedule: str, microbatches: int, steps: int, warmup: int, width: int) -> list[dict] | str:
    """Per rank, over the steps after ``warmup``: idle fraction, on-CPU share of the busy time and
    mean step time; or why the run was refused."""
    strategy = PipelineStrategy(schedule=schedule, microbatches=microbatches, partition="uniform")
    with tempfile.TemporaryDirectory() as run_dir:
        try:
            torch.manual_seed(0)
            Trainer(strategy=strategy, devices=STAGES, max_steps=warmup + steps, batch_size=BATCH,
                    log_every_n_steps=1000, loggers=None, progress_bar=False, checkpoint={"save_last": False},
                    collective_timeout_s=120, run_dir=run_dir).fit(BubbleModule(warmup + steps, width))
        except Exception as error:  # a schedule / microbatch combination torch or the strategy refuses
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return lines[-1] if lines else type(error).__name__
        records = []
        for path in sorted(glob.glob(os.path.join(run_dir, "bubble_rank*.json"))):
            with open(path) as f:
                records.append(json.load(f)[warmup:])
    # The pipeline part of a step: from the last rank entering schedule.step to the last one leaving
    # it, the same window for every rank. (A rank's own schedule.step window would not do: the loop's
    # per-step all-reduce (preemption check) holds the last stage, which finishes first, outside its
    # window while the first stage runs the final backward, and a stage that enters early waits for
    # the other's optimizer step, which is no bubble. Every stage's compute lies within the first
    # stage's window: it runs the first forward and the last backward.)
    window = sum(max(r[k][1] for r in records) - max(r[k][0] for r in records) for k in range(steps))
    idle = [1 - sum(step[2] for step in rank) / window for rank in records]
    p2p = [sum(step[4] for step in rank) / window for rank in records]
    return [{"idle": idle[r], "p2p": p2p[r], "other": idle[r] - p2p[r],
             "on_cpu": sum(step[3] for step in rank) / sum(step[2] for step in rank),
             "step_ms": 1e3 * window / steps} for r, rank in enumerate(records)]


def theory(schedule: str, microbatches: int) -> tuple[float, str]:
    p, v = STAGES, PipelineStrategy(schedule=schedule).virtual_stages  # v: the strategy's default per schedule
    if v > 1:
        return (p - 1) / (v * microbatches + p - 1), f"(p-1)/(v*m+p-1), v={v}"
    return (p - 1) / (microbatches + p - 1), "(p-1)/(m+p-1)"


def uneven_theory(ranks: list[dict], bubble: float) -> float:
    """The mean idle fraction the schedule's formula gives once the stages' measured compute is put in:
    the formula assumes equal stages, and the window then is ``1 / (1 - bubble)`` times the slowest
    rank's compute (the others wait for it in every slot), so rank r idles ``1 - (1 - bubble) busy_r /
    max busy``. Busy shares of the same window compare as the busy times themselves."""
    busy = [1 - rank["idle"] for rank in ranks]
    return sum(1 - (1 - bubble) * b / max(busy) for b in busy) / len(busy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10, help="measured steps per configuration")
    parser.add_argument("--width", type=int, default=512,
                        help="block width: compute per microbatch against the fixed per-message costs")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out first (shape inference, allocator)")
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    parser.add_argument("--microbatches", nargs="+", type=int, default=list(MICROBATCHES))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check that it runs")
    parser.add_argument("--out", default=None, help="the result file (default bench/results/pipeline_bubble.json)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.width, args.microbatches = 1, 1, 32, [4]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _results import RESULTS, Recorder

    out = args.out or (os.path.join(tempfile.mkdtemp(), "pipeline_bubble.json") if args.quick
                       else os.path.join(RESULTS, "pipeline_bubble.json"))
    recorder = Recorder("pipeline_bubble", {"steps": args.steps, "warmup": args.warmup, "width": args.width,
                                            "depth": DEPTH, "batch": BATCH, "stages": STAGES, "quick": args.quick}, out)
    rows = []
    params = DEPTH * sum(p.numel() for p in Block(args.width).parameters())
    print(f"torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; "
          f"{STAGES} ranks (gloo, 1 thread each), p={STAGES} stages")
    print(f"model: {DEPTH} MLP blocks {args.width}->{4 * args.width}->{args.width}, {params / 1e6:.1f}M parameters; "
          f"batch {BATCH}; {args.warmup} warm-up + {args.steps} measured steps per row; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'schedule':<18}{'m':>3}{'idle (mean)':>13}{'rank 0':>8}{'rank 1':>8}{'theory':>8}{'uneven':>8}{'p2p':>7}{'other':>7}"
          f"{'step ms':>9}{'on-cpu':>8}  formula")
    for schedule in args.schedules:
        for m in args.microbatches:
            bubble, formula = theory(schedule, m)
            ranks = measure(schedule, m, args.steps, args.warmup, args.width)
            rows.append({"schedule": schedule, "microbatches": m, "theory": bubble, "formula": formula,
                         **({"refused": ranks} if isinstance(ranks, str) else
                            {"ranks": ranks, "theory_measured_stages": uneven_theory(ranks, bubble)})})
            if isinstance(ranks, str):
                print(f"{schedule:<18}{m:>3}  not supported: {ranks}")
                continue
            mean = {key: sum(r[key] for r in ranks) / len(ranks) for key in ranks[0]}
            per_rank = "".join(f"{r['idle']:>8.3f}" for r in ranks)
            print(f"{schedule:<18}{m:>3}{mean['idle']:>13.3f}{per_rank}{bubble:>8.3f}{rows[-1]['theory_measured_stages']:>8.3f}"
                  f"{mean['p2p']:>7.3f}"
                  f"{mean['other']:>7.3f}{mean['step_ms']:>9.1f}"
                  f"{mean['on_cpu']:>8.2f}  {formula}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}. on-cpu: share of the compute calls' wall time the ranks' "
          "threads ran; well below 1, they were descheduled (other load on the machine) and the row is not clean.")
    recorder.write(rows)


if __name__ == "__main__":
    main()
