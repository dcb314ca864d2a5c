"""Each distributed strategy of the trainer against the hand-written torch loop of the same strategy.

    python bench/strategy_baselines.py [--strategies ddp zero1 ...] [--steps 300] [--pairs 7] [--warmup 1]
                                       [--world 2] [--width 256] [--depth 4] [--quick]
                                       [--out bench/results/strategy_baselines.json] [--note TEXT]

For every strategy (ddp, zero1, fsdp_full, fsdp_grad_op, pipeline_gpipe, pipeline_1f1b,
pipeline_interleaved, tp) two contenders train the same ``--depth`` residual MLP blocks of width
``--width`` with AdamW (lr 1e-3) on the same random regression data, global batch 64, for
``--steps`` optimizer steps on ``--world`` CPU ranks (gloo), reporting the loss every 50 steps:

- hand-written: the strategy written directly with torch's primitives (bench/_strategy_loops.py:
  ``DistributedDataParallel`` with ``no_sync`` on the first of 2 micro-batches,
  ``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard`` with ``reshard_after_forward`` True / False,
  ``torch.distributed.pipelining`` with ``ScheduleGPipe`` / ``Schedule1F1B`` /
  ``ScheduleInterleaved1F1B`` and 4 micro-batches, ``parallelize_module`` with column / row splits),
  under ``mp.spawn``;
- trainer: ``Trainer(strategy=..., devices=world, max_steps=..., log_every_n_steps=50, loggers=[],
  checkpoint=None, progress_bar=False)`` with the same global batch (the data-parallel strategies
  as 2 accumulated micro-batches, the pipeline with ``microbatches=4``, tensor parallel as
  ``strategy=nd`` with ``tp=world``). No loggers and no checkpoint: the hand-written loops write
  neither, and this bench compares the strategies; bench/hot_path_overhead.py measures the defaults.

Each run is a fresh process timed from its start to its exit; after the warm-up rounds the two run
in pairs (hand-written, trainer, hand-written, trainer ...) and each ratio is the trainer's run over
the hand-written run of the same pair; the median is printed with its min and max, and every figure
goes to ``--out`` (JSON, the format of bench/_results.py; ``results`` is ``{strategy: paired()'s
dict}``, see bench/_paired_runs.py). ``--quick`` checks that everything runs (tiny sizes, one pair,
no warm-up, the result written to a temporary file unless ``--out`` is given): its figures mean
nothing. Quote figures measured on an idle machine only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from _paired_runs import paired, run_once  # noqa: E402
from _results import RESULTS, Recorder  # noqa: E402
from _strategy_loops import STRATEGIES  # noqa: E402

CONTENDERS = ("hand-written", "trainer")


def _run(contender: str, strategy: str, args) -> None:
    if contender == "hand-written":
        from _strategy_loops import run_hand_written

        run_hand_written(strategy, args.world, args.steps, args.width, args.depth)
    else:
        from _strategy_trainer import run_trainer

        run_trainer(strategy, args.world, args.steps, args.width, args.depth)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    parser.add_argument("--world", type=int, default=2, help="ranks (CPU processes)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4, help="blocks; a multiple of 2 x world (the interleaved pipeline)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one pair: a check that it runs")
    parser.add_argument("--out", default=None, help="the result file (default bench/results/strategy_baselines.json)")
    parser.add_argument("--note", default="", help="written into the result file (e.g. what else ran)")
    parser.add_argument("--run", nargs=2, metavar=("CONTENDER", "STRATEGY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.pairs, args.warmup, args.width = 3, 1, 0, 16
    for name, value, least in (("--steps", args.steps, 1), ("--pairs", args.pairs, 1), ("--warmup", args.warmup, 0),
                               ("--world", args.world, 2), ("--width", args.width, 1)):
        if value < least:
            parser.error(f"{name} must be >= {least}, got {value}")
    if args.depth % (2 * args.world):
        parser.error(f"--depth {args.depth} must be a multiple of 2 x --world ({2 * args.world}): the interleaved "
                     "pipeline cuts it into 2 stages per rank")
    if args.run is not None:
        _run(*args.run, args)
        return
    out = args.out or (os.path.join(tempfile.mkdtemp(), "strategy_baselines.json") if args.quick
                       else os.path.join(RESULTS, "strategy_baselines.json"))
    settings = {"steps": args.steps, "pairs": args.pairs, "warmup": args.warmup, "world": args.world,
                "model": f"{args.depth} residual MLP blocks, width {args.width} (4x inner)", "optimizer": "AdamW(lr=1e-3)",
                "global_batch": 64, "quick": args.quick, "note": args.note}
    recorder = Recorder("strategy_baselines", settings, out)
    print(f"{args.world} CPU ranks (gloo), {settings['model']}, global batch 64, {args.steps} steps, whole process, "
          f"{args.warmup} warm-up round(s) then {args.pairs} pair(s); load average {recorder.load_start:.2f}")
    shape = ["--steps", str(args.steps), "--world", str(args.world), "--width", str(args.width), "--depth", str(args.depth)]
    results = {}
    for strategy in args.strategies:
        def one(contender: str, strategy: str = strategy) -> dict:
            command = [sys.executable, os.path.abspath(__file__), "--run", contender, strategy, *shape]
            return run_once(command, ROOT, done_marker=f"step {args.steps} loss" if contender == "hand-written" else None)

        results[strategy] = paired(one, list(CONTENDERS), args.pairs, args.warmup, label=f"{strategy}, ")
    print(f"\ntrainer / hand-written (wall clock, whole process; median [min, max] of {args.pairs} pair(s))")
    print(f"{'strategy':<22}{'hand-written s':>15}{'wall ratio':>12}{'spread':>18}{'cpu ratio':>11}")
    for strategy, result in results.items():
        wall, cpu = result["ratios"]["trainer"]["wall"], result["ratios"]["trainer"]["cpu"]
        hand = sorted(r["wall_s"] for r in result["runs"]["hand-written"])[len(result["runs"]["hand-written"]) // 2]
        print(f"{strategy:<22}{hand:>15.2f}{wall['median']:>12.3f}{'[%.3f, %.3f]' % (wall['min'], wall['max']):>18}"
              f"{'unknown' if cpu is None else format(cpu['median'], '.3f'):>11}")
    recorder.write(results)


if __name__ == "__main__":
    main()
