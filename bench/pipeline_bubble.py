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
"formula", "ranks": [{"idle", "p2p", "other", "on_cpu", "step_ms"} per rank], and the replays below}``
or ``{..., "refused": why}``; ``p2p``: the share of the window spent posting and waiting on the
point-to-point sends and receives (``torch.distributed.pipelining``'s batched p2p calls, timed the
same way): the bubble itself, waiting for the other stage, and the messages; ``other``: the rest of
the idle time, the schedule's own Python between calls and the last stage's loss).

Each step's calls and waits are also kept as a trace and replayed through the schedule's data
dependencies (bench/_pipeline_trace.py): ``replay_mean_calls`` (every call at its rank's mean for
its kind, nothing between calls: the bubble of these stages, imbalance included),
``replay_measured_calls`` (the calls as measured, nothing between them), ``replay_with_local_work``
(plus the ranks' work between calls but posting the messages: the schedule's Python, the loss),
``replay_with_posting`` (plus the time ``isend`` / ``irecv`` take to return; ``posting_ms_per_step``:
that time per rank and step), ``replay_with_hop`` (plus the measured hop, ``hop_ms``: a producing
call's end to the end of the waiting consumer's receive, median over ``hops`` messages) and
``call_ms`` (the median compute call).
Where ``replay_with_hop`` meets the measured idle fraction, the trace accounts for all of it.
``--quick`` checks that it runs (width 32, 1 measured step after 1 warm-up, m = 4, the result in a
temporary file unless ``--out`` is given): its figures mean nothing.
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
from _pipeline_trace import decompose  # noqa: E402
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
        self.busy, self.busy_cpu, self.p2p, self.depth, self.records, self.events = 0.0, 0.0, 0.0, 0, [], []
        for stage in strategy.pipeline_stages:
            for name, kind in zip(TIMED, "FBW"):
                setattr(stage, name, self._timed(getattr(stage, name), kind, stage.stage_index))
        from torch.distributed.pipelining import schedules

        for name in ("_batch_p2p", "_wait_batch_p2p"):  # module functions the schedules look up at call time
            if not hasattr(getattr(schedules, name), "timed_by_bench"):
                setattr(schedules, name, self._timed(getattr(schedules, name), "wait" if "wait" in name else "post"))
        step = strategy.schedule.step  # the strategy calls self.schedule.step: an instance attribute wins

        def timed_step(*args, **kwargs):
            self.busy = self.busy_cpu = self.p2p = 0.0
            self.events = []
            start = time.perf_counter()
            result = step(*args, **kwargs)
            # perf_counter is CLOCK_MONOTONIC on Linux: one clock for all processes of the machine,
            # so the parent can line the ranks' steps up.
            self.records.append((start, time.perf_counter(), self.busy, self.busy_cpu, self.p2p, self.events))
            return result

        strategy.schedule.step = timed_step

    def _timed(self, method, kind: str, stage: int = -1):
        """``kind``: F / B / W (a stage's compute call: busy time) or ``wait`` / ``post`` (waiting on
        sends and receives / posting them: p2p time); every call is an event of the step's trace."""
        def wrapper(*args, **kwargs):
            if kind in ("wait", "post"):
                start = time.perf_counter()
                try:
                    return method(*args, **kwargs)
                finally:
                    end = time.perf_counter()
                    self.p2p += end - start
                    self.events.append([kind, -1, -1, start, end])

            # Count only the outermost call, in case one timed method ever calls another.
            self.depth += 1
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    end = time.perf_counter()
                    self.busy += end - start
                    self.busy_cpu += time.thread_time() - start_cpu
                    chunk = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1))
                    self.events.append([kind, stage, chunk, start, end])
        wrapper.timed_by_bench = True
        return wrapper

    def on_fit_end(self):
        rank = torch.distributed.get_rank()
        with open(os.path.join(self.trainer.run_dir, f"bubble_rank{rank}.json"), "w") as f:
            json.dump(self.records, f)


def measure(schedule: str, microbatches: int, steps: int, warmup: int,
            width: int) -> tuple[list[dict], dict] | str:
    """Per rank, over the steps after ``warmup``: idle fraction, on-CPU share of the busy time and
    mean step time, and the replays of the steps' trace (bench/_pipeline_trace.py); or why the run
    was refused."""
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
    ranks = [{"idle": idle[r], "p2p": p2p[r], "other": idle[r] - p2p[r],
              "on_cpu": sum(step[3] for step in rank) / sum(step[2] for step in rank),
              "step_ms": 1e3 * window / steps} for r, rank in enumerate(records)]
    trace = [[{"start": max(r[k][0] for r in records), "end": rank[k][1], "events": rank[k][5]} for rank in records]
             for k in range(steps)]
    return ranks, decompose(trace)


def theory(schedule: str, microbatches: int) -> tuple[float, str]:
    p, v = STAGES, PipelineStrategy(schedule=schedule).virtual_stages  # v: the strategy's default per schedule
    if v > 1:
        return (p - 1) / (v * microbatches + p - 1), f"(p-1)/(v*m+p-1), v={v}"
    return (p - 1) / (microbatches + p - 1), "(p-1)/(m+p-1)"


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
    replays = ("replay_mean_calls", "replay_measured_calls", "replay_with_local_work", "replay_with_posting",
               "replay_with_hop")
    print(f"{'schedule':<18}{'m':>3}{'idle (mean)':>13}{'rank 0':>8}{'rank 1':>8}{'theory':>8}{'mean':>7}{'calls':>7}"
          f"{'+work':>7}{'+post':>7}{'+hop':>7}{'hop ms':>8}{'call ms':>8}{'post ms':>8}{'step ms':>9}{'on-cpu':>8}"
          "  formula")
    for schedule in args.schedules:
        for m in args.microbatches:
            bubble, formula = theory(schedule, m)
            measured = measure(schedule, m, args.steps, args.warmup, args.width)
            if isinstance(measured, str):
                rows.append({"schedule": schedule, "microbatches": m, "theory": bubble, "formula": formula,
                             "refused": measured})
                print(f"{schedule:<18}{m:>3}  not supported: {measured}")
                continue
            ranks, split = measured
            rows.append({"schedule": schedule, "microbatches": m, "theory": bubble, "formula": formula,
                         "ranks": ranks, **split})
            mean = {key: sum(r[key] for r in ranks) / len(ranks) for key in ranks[0]}
            per_rank = "".join(f"{r['idle']:>8.3f}" for r in ranks)
            print(f"{schedule:<18}{m:>3}{mean['idle']:>13.3f}{per_rank}{bubble:>8.3f}"
                  + "".join(f"{split[key]:>7.3f}" for key in replays)
                  + f"{split['hop_ms']:>8.2f}{split['call_ms']:>8.2f}{split['posting_ms_per_step']:>8.1f}"
                  f"{mean['step_ms']:>9.1f}{mean['on_cpu']:>8.2f}  {formula}", flush=True)
    print("mean ... +hop: the steps replayed from their dependencies (bench/_pipeline_trace.py), each adding one "
          "measured cost: every call at its rank's mean; the calls as measured; the ranks' work between calls "
          "but posting; posting the messages (post ms: per rank and step); the measured hop on each message.")
    print(f"load average after: {os.getloadavg()[0]:.2f}. on-cpu: share of the compute calls' wall time the ranks' "
          "threads ran; well below 1, they were descheduled (other load on the machine) and the row is not clean.")
    recorder.write(rows)


if __name__ == "__main__":
    main()
