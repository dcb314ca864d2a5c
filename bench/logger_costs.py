"""What each default logger and the last checkpoint cost the thread that trains.

    python bench/logger_costs.py [--calls 200] [--steps 50] [--loggers tensorboard,jsonl,csv,wandb,mlflow]
                                 [--out bench/results/logger_costs.json]

In one process, for the TensorBoard, JSONL and CSV loggers (and W&B offline and MLflow in a local
store, where their packages are installed) as ``loggers=[...]`` builds them (into a fresh run
directory): the caller's time for the first write (the configuration, then one row of
metrics: what opens the logger), the median caller's time of a logging step's write (``--calls``
rows of 4 numbers, as the loop hands them), and the close at the end
(``finalize``, which waits for what is queued). Then bench/hot_path_overhead.py's MLP trained for
``--steps`` steps by ``Trainer`` with its default checkpoint (``save_last``): the last checkpoint's
write as the run's log line gives it, its wait at the end of the run, and its size on disk. The
figures are times of one process on a possibly busy machine: ``--out`` keeps them with the load
average (bench/_results.py's format; ``results``: ``{"loggers": {name: {"first_write_s",
"per_log_us", "close_s"}}, "checkpoint": {"write_s", "fit_s", "fit_without_checkpoint_s", "bytes"}}``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from _results import Recorder  # noqa: E402


#: each logger's options here: W&B offline (never an upload), MLflow in a local store in the run directory
OPTIONS = {"wandb": lambda run_dir: {"mode": "offline"},
           "mlflow": lambda run_dir: {"tracking_uri": os.path.join(run_dir, "mlruns")}}


def logger_costs(name: str, calls: int) -> dict:
    from trainer.loggers.registry import build_loggers

    with tempfile.TemporaryDirectory() as run_dir:
        (logger,) = build_loggers({name: OPTIONS.get(name, lambda _: {})(run_dir)}, run_dir)
        start = time.perf_counter()
        logger.log_hyperparams({"model": {"width": 256, "layers": 3}, "optimizer": {"lr": 1e-3}})
        logger.log_metrics({"train/loss": 2.3, "lr": 1e-3}, 0)
        first = time.perf_counter() - start
        times = []
        for step in range(1, calls + 1):
            row = {"train/loss": 1.0 / step, "lr": 1e-3, "epoch": 0, "perf/step_time_s": 0.01}
            start = time.perf_counter()
            logger.log_metrics(row, step)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        logger.finalize("success")
        close = time.perf_counter() - start
    return {"first_write_s": first, "per_log_us": 1e6 * statistics.median(times), "close_s": close}


class _CheckpointLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

    def emit(self, record):
        found = re.search(r"checkpoint at step \d+ .* in ([\d.]+) s", record.getMessage())
        if found:
            self.seconds.append(float(found.group(1)))


def checkpoint_costs(steps: int) -> dict:
    from _trainer_mlp import MLPModule
    from trainer import Trainer

    lines = _CheckpointLines()
    logging.getLogger("trainer").addHandler(lines)
    figures = {}
    with tempfile.TemporaryDirectory() as run_dir:  # a warm-up: the first fit of a process also imports and builds
        Trainer(max_steps=2, batch_size=64, loggers=[], checkpoint=None, progress_bar=False, enable_model_summary=False,
                run_dir=run_dir).fit(MLPModule())
    for label, checkpoint in (("fit_s", {}), ("fit_without_checkpoint_s", None)):
        with tempfile.TemporaryDirectory() as run_dir:
            args = {} if checkpoint is not None else {"checkpoint": None}
            start = time.perf_counter()
            Trainer(max_steps=steps, batch_size=64, log_every_n_steps=50, loggers=[], progress_bar=False,
                    enable_model_summary=False, run_dir=run_dir, **args).fit(MLPModule())
            figures[label] = time.perf_counter() - start
            if checkpoint is not None:
                figures["bytes"] = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(run_dir)
                                       for f in files if "checkpoints" in d)
    logging.getLogger("trainer").removeHandler(lines)
    figures["write_s"] = lines.seconds[-1] if lines.seconds else None
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="logging-step writes timed per logger")
    parser.add_argument("--steps", type=int, default=50, help="training steps of the checkpoint's run")
    parser.add_argument("--loggers", default="tensorboard,jsonl,csv,wandb,mlflow",
                        help="the loggers measured, by name (wandb and mlflow: skipped when not installed)")
    parser.add_argument("--out", default=None, help="the result file (default bench/results/logger_costs.json)")
    args = parser.parse_args()
    names = [name for name in args.loggers.split(",") if name]
    missing = [name for name in names if name in OPTIONS and importlib.util.find_spec(name) is None]
    if missing:
        print(f"skipped (not installed): {', '.join(missing)}")
    recorder = Recorder("logger_costs", {"calls": args.calls, "steps": args.steps, "loggers": names}, args.out)
    loggers = {name: logger_costs(name, args.calls) for name in names if name not in missing}
    print(f"{'logger':<13}{'first write s':>14}{'per log call us':>17}{'close s':>9}  (the training thread's time)")
    for name, f in loggers.items():
        print(f"{name:<13}{f['first_write_s']:>14.4f}{f['per_log_us']:>17.1f}{f['close_s']:>9.4f}")
    checkpoint = checkpoint_costs(args.steps)
    write = checkpoint["write_s"]
    print(f"last checkpoint: written in {'?' if write is None else format(write, '.3f')} s, {checkpoint['bytes']} bytes; "
          f"fit {checkpoint['fit_s']:.2f} s with it, {checkpoint['fit_without_checkpoint_s']:.2f} s without "
          f"({args.steps} steps; load average {os.getloadavg()[0]:.2f})")
    recorder.write({"loggers": loggers, "checkpoint": checkpoint})


if __name__ == "__main__":
    main()
