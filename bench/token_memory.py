"""Peak memory of training on token shards does not grow with the shard: the gpt recipe trains a few
steps on one shard of the standard library's text, then on one ten times larger (the same text
repeated ten times), each in a fresh process.

    python bench/token_memory.py [--mb 2] [--steps 20] [--repeat 10] [--runs 2]

"peak growth" is the training process's peak RSS over its ``import torch`` baseline; at the end its
RSS is split into "anon" (the process's own memory: model, optimizer, batches, data plan) and
"file" (file-backed pages: the shared libraries, plus the shard pages mapped from the page cache:
shards are read through ``numpy.memmap``, and each
window touched maps its neighbourhood too, the kernel's fault-around of up to 64 KiB, so "file"
grows with the windows read, up to the shard's size; those pages are clean and the kernel drops
them under memory pressure). Validation is off (it reads the whole held-out tail, which grows
with the corpus by design). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import functools, json, resource, sys
import torch
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def status(key): return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
baseline = peak()
from trainer.recipes.gpt import GPTModule
from trainer import Trainer
tokens, steps, run_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module = GPTModule(optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), tokens=tokens, block_size=64)
Trainer(max_steps=steps, batch_size=16, log_every_n_steps=steps, val_every_n_steps=None, num_sanity_val_steps=0,
        loggers=[], progress_bar=False, checkpoint=None, run_dir=run_dir).fit(module)
print(json.dumps({"sequences": len(module.train_dataset()), "baseline": baseline, "growth": peak() - baseline,
                  "anon": status("RssAnon"), "file": status("RssFile")}))
"""


def _prepare(text: str, out: str, *extra: str) -> dict:
    subprocess.run([sys.executable, "-m", "trainer.recipes.prepare_text", text, out, "--shard-tokens", str(1 << 30),
                    "--val-fraction", "0.01", *extra], check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": ROOT})
    with open(os.path.join(out, "manifest.json")) as handle:
        return json.load(handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="MB of standard-library text in the small corpus")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=10, help="the large corpus is the small one this many times")
    parser.add_argument("--runs", type=int, default=2, help="fresh processes per corpus, one row each (RSS varies run to run)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from trainer.recipes.text_data import python_stdlib_text

    text = python_stdlib_text(int(args.mb * 1e6))
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"recipe=gpt defaults (block 64, batch 16), {args.steps} steps, no validation")
    print(f"{'corpus':>10} {'shard tokens':>13} {'shard file':>11} {'sequences':>10} {'baseline':>9} "
          f"{'peak growth':>12} {'anon at end':>12} {'file at end':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for name, copies in (("small", 1), ("large", args.repeat)):
            path = os.path.join(tmp, f"{name}.txt")
            with open(path, "wb") as handle:
                for _ in range(copies):  # written a copy at a time (never the whole large corpus in memory)
                    handle.write(text)
            extra = () if name == "small" else ("--tokenizer", os.path.join(tmp, "small", "tokenizer.json"))
            manifest = _prepare(path, os.path.join(tmp, name), *extra)
            runs.append((name, copies, manifest))
        for name, copies, manifest in [run for run in runs for _ in range(args.runs)]:
            out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(tmp, name), str(args.steps),
                                  os.path.join(tmp, f"run-{name}")], capture_output=True, text=True, check=True,
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
            r = json.loads(out.stdout.strip().splitlines()[-1])
            shard = manifest["train"][0]
            print(f"{len(text) * copies / 1e6:>8.1f}MB {shard['tokens']:>13,} {shard['bytes'] / 1e6:>9.1f}MB "
                  f"{r['sequences']:>10,} {r['baseline'] / 2**20:>7.0f}MB {r['growth'] / 2**20:>10.1f}MB "
                  f"{r['anon'] / 2**20:>10.1f}MB {r['file'] / 2**20:>10.1f}MB")


if __name__ == "__main__":
    main()
