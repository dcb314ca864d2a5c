"""Per-step overhead of the trainer against a hand-written loop and Lightning, in one run.

    python bench/step_overhead.py [--steps 150] [--repeats 3] [--out bench/results/step_overhead.json]

All three train the same small GPT (recipes/gpt.py) on the same data with AdamW, one process,
for the same number of steps; the table gives steps/s and the ratio to the hand-written loop
(best of ``--repeats``, contenders interleaved so machine noise hits all of them alike).
Lightning is measured only if it is installed (``pip install lightning``). The figures go to
``--out`` too (bench/_results.py's format; ``results``: {contender: {"seconds" (best), "steps_per_s",
"ratio" (to the hand-written loop)} or null when not installed}).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import torch
import torch.nn.functional as F

from trainer.recipes.gpt import GPT, GPTModule
from _results import Recorder
from trainer import Trainer

MODEL = dict(vocab_size=256, block_size=64, layers=2, heads=4, width=128, dropout=0.0)
BATCH = 16


def dataset():
    return GPTModule(block_size=64).train_dataset()


def hand_written(steps: int) -> float:
    torch.manual_seed(0)
    model = GPT(**MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    start = time.perf_counter()
    done = 0
    while done < steps:
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    return time.perf_counter() - start


class _TimedModule(GPTModule):
    # Times the training steps only, as for the other two: the final validation pass (which
    # the hand-written loop and the Lightning run do not have) is left out.
    def on_fit_start(self):
        self.started = time.perf_counter()

    def on_train_step_end(self, step, metrics):
        if step == self.trainer.max_steps:
            self.elapsed = time.perf_counter() - self.started


def ours(steps: int) -> float:
    torch.manual_seed(0)
    from functools import partial

    module = _TimedModule(optimizer=partial(torch.optim.AdamW, lr=1e-3), block_size=64)
    with tempfile.TemporaryDirectory() as run_dir:
        Trainer(max_steps=steps, batch_size=BATCH, log_every_n_steps=50, loggers=["jsonl"], progress_bar=False,
                checkpoint=None, run_dir=run_dir).fit(module)
    return module.elapsed


def lightning(steps: int) -> float | None:
    try:
        import lightning as L
    except ImportError:
        return None

    class LitGPT(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPT(**MODEL)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            loss = F.cross_entropy(self.model(inputs).flatten(0, 1), targets.flatten())
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def on_train_start(self):
            self.started = time.perf_counter()

        def on_train_end(self):
            self.elapsed = time.perf_counter() - self.started

    torch.manual_seed(0)
    module = LitGPT()
    loader = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    with tempfile.TemporaryDirectory() as root:
        L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=50,
                  default_root_dir=root).fit(module, loader)
    return module.elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="the result file (default bench/results/step_overhead.json)")
    args = parser.parse_args()
    recorder = Recorder("step_overhead", {"steps": args.steps, "repeats": args.repeats, "figure": "best of repeats",
                                          "model": f"GPT {MODEL['layers']}x{MODEL['width']}",
                                          "batch": f"{BATCH}x{MODEL['block_size']}", "optimizer": "AdamW(lr=1e-3)"}, args.out)
    contenders = {"hand-written loop": hand_written, "trainer (this repo)": ours, "lightning": lightning}
    best: dict[str, float | None] = {name: None for name in contenders}
    for run in contenders.values():  # warm-up: thread pools, allocator, imports
        run(10)
    for _ in range(args.repeats):
        for name, run in contenders.items():
            elapsed = run(args.steps)
            if elapsed is not None:
                best[name] = elapsed if best[name] is None else min(best[name], elapsed)
    base = best["hand-written loop"]
    print(f"\n{args.steps} steps, GPT {MODEL['layers']}x{MODEL['width']}, batch {BATCH}x{MODEL['block_size']}, "
          f"torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print(f"{'contender':<22}{'steps/s':>10}{'time vs loop':>14}")
    for name, elapsed in best.items():
        if elapsed is None:
            print(f"{name:<22}{'not installed':>24}")
        else:
            print(f"{name:<22}{args.steps / elapsed:>10.1f}{elapsed / base:>14.3f}")
    recorder.write({name: None if elapsed is None else {"seconds": elapsed, "steps_per_s": args.steps / elapsed,
                                                        "ratio": elapsed / base} for name, elapsed in best.items()})


if __name__ == "__main__":
    main()
