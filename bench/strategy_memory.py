"""Memory per rank by strategy: the training state each rank holds (parameters, gradients, optimizer
state) under single, DDP, ZeRO-1, FSDP grad_op / full and pipeline, measured on 2 CPU processes, beside
what the estimator (``trainer estimate``) predicts for the same layout.

    python bench/strategy_memory.py [--layers 4] [--width 256] [--out bench/results/strategy_memory.json]

The model is the gpt recipe's (byte-level GPT, AdamW, fp32), ``--layers`` x ``--width``. Each rank counts,
after its first optimizer step (gradients and optimizer state both held), the bytes of every storage
behind its parameters, gradients and optimizer state (``trainer/runtime/memory.py``, ``allocated=True``:
FSDP's padded shards and DDP's gradient buckets as allocated); the bytes are what the strategy keeps,
whatever else runs on the machine. "peak_rss" is the rank's process peak (libraries and the data
included), for scale. Activations are not in these figures (the estimator's activation column is).

Result file (bench/_results.py's format): ``results``: {layout: {"strategy", "options", "world",
"measured": [per rank {"parameters", "gradients", "optimizer", "total", "peak_rss"}],
"estimated": [per rank {"parameters", "gradients", "optimizer", "total"}]}} in bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from functools import partial

import torch

from _results import Recorder

#: layout -> (strategy, its options, processes)
LAYOUTS = {
    "single": ("single", {}, 1),
    "ddp": ("ddp", {}, 2),
    "ddp zero1": ("ddp", {"zero1": True}, 2),
    "fsdp grad_op": ("fsdp", {"sharding": "grad_op"}, 2),
    "fsdp full": ("fsdp", {"sharding": "full"}, 2),
    "pipeline": ("pipeline", {}, 2),
}
PARTS = ("parameters", "gradients", "optimizer")


def measure(strategy: str, options: dict, world: int, model: dict, out: str) -> list[dict]:
    from _memory_modules import MeasuredGPT
    from trainer import Trainer
    from trainer.strategies import resolve_strategy

    module = MeasuredGPT(out, optimizer=partial(torch.optim.AdamW, lr=1e-3), max_bytes=200_000, **model)
    Trainer(strategy=resolve_strategy(strategy, **options), devices=world, max_steps=1, batch_size=8,
            loggers=[], checkpoint=None, progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            run_dir=os.path.join(out, "run")).fit(module)
    ranks = []
    for rank in range(world):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def estimate(strategy: str, options: dict, world: int, model: dict) -> list[dict]:
    from _memory_modules import MeasuredGPT
    from trainer.estimate.model import build_fake, fake_mode, model_shapes
    from trainer.estimate.plan import Setting, configured_row

    mode = fake_mode()
    module = build_fake(lambda: MeasuredGPT("", optimizer=partial(torch.optim.AdamW, lr=1e-3), max_bytes=200_000,
                                            **model), mode)
    shapes = model_shapes(module, mode)
    row = configured_row(module, shapes, None, Setting(world=world, devices_per_node=world, batch_size=8,
                                                       strategy=strategy, options=options))
    return [{**{part: getattr(r, part) for part in PARTS}, "total": r.state} for r in row.ranks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", help="the result file (default bench/results/strategy_memory.json)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    model = dict(layers=args.layers, width=args.width, heads=4, block_size=64)
    recorder = Recorder("strategy_memory", {"model": f"GPT {args.layers}x{args.width} (recipe=gpt), fp32",
                                            "optimizer": "AdamW", "batch per rank": 8,
                                            "measured": "after the first optimizer step"}, args.out)
    results = {}
    print(f"{'layout':<14}{'rank':>5}{'params MB':>11}{'grads MB':>10}{'optim MB':>10}{'total MB':>10}"
          f"{'estimated MB':>14}{'peak RSS MB':>13}")
    for name, (strategy, options, world) in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as out:
            measured = measure(strategy, options, world, model, out)
        estimated = estimate(strategy, options, world, model)
        results[name] = {"strategy": strategy, "options": options, "world": world, "measured": measured,
                         "estimated": estimated}
        for rank, (m, e) in enumerate(zip(measured, estimated)):
            print(f"{name:<14}{rank:>5}" + "".join(f"{m[p] / 2**20:>10.2f} " for p in PARTS)
                  + f"{m['total'] / 2**20:>9.2f}{e['total'] / 2**20:>14.2f}{m['peak_rss'] / 2**20:>13.0f}", flush=True)
    recorder.write(results)


if __name__ == "__main__":
    main()
