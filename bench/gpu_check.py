"""What bench/gpu_check.sh runs: the checks to make the first time a CUDA device is at hand.

    python bench/gpu_check.py [--sections NAME ...] [--budget-s 480] [--out bench/results/gpu_check.json]
                              [--dry] [--plumbing]

Sections (run in the order of ``SECTIONS``: the short checks, then the recipes, then the estimate),
each within what is left of ``--budget-s`` (a section or a recipe run that would start past it is
recorded as skipped, with the reason; the recipes run eager first, compile last, and leave
``ESTIMATE_RESERVE_S`` to the estimate):

- ``gpu_tests``: every test marked ``gpu`` (``pytest -m gpu`` on the files that hold the mark);
- ``recipes``: the gpt and llama recipes at a size that fills an 80 GB device (about 0.8B and 0.7B
  parameters, bf16-mixed) trained by the trainer (``train.py``) eager, with ``trainer.compile`` and
  with ``trainer.activation_checkpointing``, beside a hand-written loop of the same model (the
  recipe's own ``nn.Module``, bf16 autocast, fused AdamW; eager and each block compiled):
  tokens/s, TFLOP/s per device and MFU (the trainer's ``perf/*`` metrics over its last logging
  window; the loop's over its timed steps, FLOPs counted once by torch's FLOP counter);
- ``fp16``: the gpt recipe with ``precision=fp16-mixed`` (dynamic loss scaling): finite losses,
  the last below the first;
- ``fsdp_offload``: the llama recipe under ``strategy=fsdp strategy.cpu_offload=true`` on one device;
- ``estimate``: ``trainer estimate``'s total for the recipe run against the run's
  ``torch.cuda.max_memory_allocated`` (the trainer's ``memory/peak_allocated_gb``);
- ``host_syncs``: host syncs per quiet step (trainer/observe/host_syncs.py's ``HostSyncCounter``
  through ``HotPathProbe``) of the gpt recipe, bf16-mixed; a quiet step should have none.

Without CUDA (or with ``--dry``) every section runs its own code path at tiny sizes on the CPU
(compile and the CUDA-only checks, offload and fp16's scaler, are named as skipped) and the file
says ``"mode": "dry"``: a check of this script, not a measurement. ``--plumbing`` runs nothing: it
builds every command and writes the file (what the unit test runs). The result file: ``{"benchmark":
"gpu_check", "date", "command", "machine" (with "gpu"), "load_average", "settings": {"mode",
"budget_s", "sections"}, "results": {section: {"status": "ok" | "failed" | "skipped", "seconds",
...its figures}}}`` (bench/_results.py); ``python bench/plot_results.py`` puts it on the benchmarks page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

#: in the order they run: the short checks first, the recipes' runs (the longest) then, the estimate last
#: (it compares with the recipes' eager runs)
SECTIONS = ("gpu_tests", "host_syncs", "fp16", "fsdp_offload", "recipes", "estimate")
#: seconds of the budget the recipes leave to the estimate
ESTIMATE_RESERVE_S = 60
VARIANTS = {"eager": [], "compile": ["trainer.compile=true"], "checkpointing": ["trainer.activation_checkpointing=true"]}
#: model and batch per recipe: on CUDA (about 0.8B / 0.7B parameters, 16k tokens a step) and for the dry run
SIZES = {
    ("gpt", True): {"layers": 16, "width": 2048, "heads": 16, "block_size": 1024, "batch_size": 16},
    ("llama", True): {"layers": 16, "width": 2048, "heads": 16, "kv_heads": 4, "ffn_multiple_of": 256,
                      "block_size": 2048, "batch_size": 8},
    ("gpt", False): {"layers": 1, "width": 32, "heads": 2, "block_size": 16, "batch_size": 2},
    ("llama", False): {"layers": 1, "width": 32, "heads": 2, "kv_heads": 1, "ffn_multiple_of": 32,
                       "block_size": 16, "batch_size": 2},
}
STEPS = {True: (30, 10), False: (2, 1)}  # (max_steps, log_every_n_steps): the last window is past compile's steps
QUIET = ["logger=[jsonl]", "checkpoint.save_last=false", "trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0",
         "trainer.enable_model_summary=false", "trainer.progress_bar=false"]


# ----- pieces -----------------------------------------------------------------------------------------------
def run_command(command: list[str], timeout_s: float) -> dict:
    """``command`` from the repository root: its exit code, seconds and the end of its output."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout_s, 1))
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        code, text = None, f"{error.stdout or ''}{error.stderr or ''}\n(stopped after {timeout_s:.0f} s)"
        text = text if isinstance(text, str) else text.decode(errors="replace")
    return {"exit_code": code, "seconds": round(time.perf_counter() - start, 2), "output_tail": text[-1500:]}


def size_overrides(recipe: str, cuda: bool) -> list[str]:
    size = SIZES[(recipe, cuda)]
    data = {"block_size", "batch_size"}
    return [f"{'data' if k in data else 'module'}.{k}={v}" for k, v in size.items()]


def trainer_command(recipe: str, cuda: bool, run_dir: str, extra: list[str], precision: str = "bf16-mixed",
                    size: list[str] | None = None, steps: int | None = None) -> list[str]:
    """``train.py`` for ``recipe`` (each key given once: Hydra refuses a key overridden twice)."""
    default_steps, every = STEPS[cuda]
    return [sys.executable, os.path.join(ROOT, "train.py"), f"recipe={recipe}", f"precision={precision}",
            f"trainer.accelerator={'cuda' if cuda else 'cpu'}", f"trainer.max_steps={steps or default_steps}",
            f"trainer.log_every_n_steps={every}", *QUIET, *(size or size_overrides(recipe, cuda)), *extra,
            f"hydra.run.dir={run_dir}"]


def metrics_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def last_with(rows: list[dict], key: str) -> dict:
    return next((row for row in reversed(rows) if key in row), {})


def perf_of(rows: list[dict]) -> dict:
    """The trainer's speed over its last logging window, and its peak memory."""
    row = last_with(rows, "perf/tokens_per_s")
    names = {"perf/tokens_per_s": "tokens_per_s", "perf/tflops_per_device": "tflops_per_device", "perf/mfu": "mfu",
             "memory/peak_allocated_gb": "peak_allocated_gb", "perf/step_time_s": "step_time_s"}
    return {short: row[key] for key, short in names.items() if key in row}


def _gib(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"B": 2 ** -30, "KiB": 2 ** -20, "MiB": 2 ** -10, "GiB": 1.0, "TiB": 1024.0}[unit]


def estimate_total_gib(output: str) -> float | None:
    """The configured strategy's rank 0 total from ``trainer estimate``'s table (GiB)."""
    for line in output.splitlines():
        if line.startswith("rank 0"):
            cells = re.findall(r"[\d.,]+ (?:B|KiB|MiB|GiB|TiB)", line)
            if cells:
                return _gib(cells[-1])
    return None


# ----- the hand-written loop and the sync probe (each run as its own process) -------------------------------
def hand_written(recipe: str, cuda: bool, compiled: bool) -> dict:
    """The recipe's model trained by a plain loop on random tokens: tokens/s, TFLOP/s, MFU."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.observe.throughput import peak_tflops

    size, device = SIZES[(recipe, cuda)], torch.device("cuda" if cuda else "cpu")
    steps, warmup = (10, 5) if cuda else (2, 1)
    batch, length, vocab = size["batch_size"], size["block_size"], 256
    torch.manual_seed(0)
    if recipe == "gpt":
        from trainer.recipes.gpt import GPT

        model = GPT(vocab_size=vocab, block_size=length, layers=size["layers"], heads=size["heads"], width=size["width"],
                    dropout=0.0)
        blocks = model.blocks
    else:
        from trainer.recipes.llama import Llama, ffn_hidden_size

        model = Llama(vocab_size=vocab, layers=size["layers"], width=size["width"], heads=size["heads"],
                      kv_heads=size["kv_heads"], ffn_hidden=ffn_hidden_size(size["width"], size["ffn_multiple_of"], None),
                      rope_theta=10000.0, norm_eps=1e-5)
        blocks = model.layers
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    tokens = torch.randint(0, vocab, (batch, length + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def forward_backward():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        return loss

    with FlopCounterMode(display=False) as counter:  # eager, before any compile
        forward_backward()
    optimizer.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()
    if compiled:
        for block in blocks:
            block.compile()

    def step():
        loss = forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss = float(loss)
    elapsed = time.perf_counter() - start
    tflops = flops * steps / elapsed / 1e12
    peak = peak_tflops(device, True)
    return {"tokens_per_s": batch * length * steps / elapsed, "tflops_per_device": tflops,
            "mfu": tflops / peak if peak else None, "step_time_s": elapsed / steps, "loss": loss,
            "parameters": sum(p.numel() for p in model.parameters()),
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None}


def probe_syncs(cuda: bool) -> dict:
    """Host syncs per step of the gpt recipe (bf16-mixed) counted by ``HotPathProbe``: the quiet
    steps (neither the first nor a logging step) and the logging steps."""
    from functools import partial

    import torch

    from trainer import Trainer
    from trainer.observe.host_syncs import HotPathProbe, read_hot_path
    from trainer.recipes.gpt import GPTModule

    size, every, steps = SIZES[("gpt", False)], 5, 11  # the count does not depend on the model's size
    module = GPTModule(optimizer=partial(torch.optim.AdamW, lr=3e-4), layers=size["layers"], heads=size["heads"],
                       width=size["width"], block_size=size["block_size"], max_bytes=20_000)
    with tempfile.TemporaryDirectory() as run_dir:
        Trainer(accelerator="cuda" if cuda else "cpu", max_steps=steps, batch_size=size["batch_size"],
                log_every_n_steps=every, precision="bf16-mixed", loggers=[], checkpoint=None, progress_bar=False,
                enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[HotPathProbe()],
                run_dir=run_dir).fit(module)
        windows = read_hot_path(run_dir, 1)[0]
    quiet = {s: w for s, w in windows.items() if s > 1 and s % every and (s - 1) % every}
    return {"quiet_steps": len(quiet), "syncs_per_quiet_step": max((w["syncs"] for w in quiet.values()), default=None),
            "where": sorted({place for w in quiet.values() for place in w["where"]}),
            "syncs_per_logging_step": max((w["syncs"] for s, w in windows.items() if s % every == 0), default=None)}


# ----- sections ---------------------------------------------------------------------------------------------
class Check:
    def __init__(self, cuda: bool, plumbing: bool, budget_s: float):
        self.cuda, self.plumbing, self.budget_s = cuda, plumbing, budget_s
        self.start = time.perf_counter()
        self.work = tempfile.mkdtemp(prefix="gpu_check_")

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def run(self, command: list[str]) -> dict:
        if self.plumbing:
            return {"exit_code": 0, "seconds": 0.0, "output_tail": "", "command": command[1:]}
        return {**run_command(command, self.left()), "command": command[1:]}

    def own(self, mode: str, *args: str) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), f"--{mode}", *args, *([] if self.cuda else ["--dry"])]

    def gpu_tests(self) -> dict:
        found = subprocess.run(["grep", "-rlE", r"mark\.gpu", "tests"], cwd=ROOT, capture_output=True, text=True)
        files = sorted(path for path in found.stdout.split() if path.endswith(".py") and "conftest" not in path)
        if not self.cuda:
            return {"status": "skipped", "reason": "no CUDA", "files": files}
        done = self.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files])
        summary = (done["output_tail"].strip().splitlines() or [""])[-1]
        return {"status": "ok" if done["exit_code"] == 0 else "failed", "files": files, "summary": summary, **done}

    def recipes(self) -> dict:
        """Eager runs of both recipes first, then activation checkpointing, then compile (the slowest),
        so that a budget running out cuts the last ones."""
        plan = [(recipe, contender, variant) for variant in ("eager", "checkpointing", "compile")
                for recipe in ("gpt", "llama") for contender in ("trainer", "hand-written")
                if not (contender == "hand-written" and variant == "checkpointing")]
        rows = []
        for recipe, contender, variant in plan:
            row = {"recipe": recipe, "contender": contender, "variant": variant}
            if variant == "compile" and not self.cuda:
                rows.append({**row, "status": "skipped", "reason": "compile is checked on CUDA only (minutes on a CPU)"})
                continue
            if not self.plumbing and self.left() < ESTIMATE_RESERVE_S:
                rows.append({**row, "status": "skipped", "reason": f"the {self.budget_s:.0f} s budget was spent"})
                continue
            if contender == "trainer":
                run_dir = os.path.join(self.work, f"{recipe}_{variant}")
                done = self.run(trainer_command(recipe, self.cuda, run_dir, VARIANTS[variant]))
                figures = perf_of(metrics_rows(run_dir))
                ok = done["exit_code"] == 0 and (self.plumbing or "tokens_per_s" in figures)
            else:
                done = self.run(self.own("hand", recipe, *(["--compiled"] if variant == "compile" else [])))
                figures = _json_line(done["output_tail"]) or {}
                ok = done["exit_code"] == 0 and (self.plumbing or bool(figures))
            rows.append({**row, "status": "ok" if ok else "failed", **figures, **done})
        failed = [r for r in rows if r["status"] == "failed"]
        return {"status": "failed" if failed else "ok", "rows": rows}

    def fp16(self) -> dict:
        if not self.cuda:
            return {"status": "skipped", "reason": "no CUDA: fp16-mixed's loss scaling runs on CUDA"}
        run_dir = os.path.join(self.work, "fp16")
        small = ["module.layers=4", "module.width=512", "module.heads=8", "data.batch_size=16", "data.block_size=256"]
        done = self.run(trainer_command("gpt", True, run_dir, [], precision="fp16-mixed", size=small, steps=100))
        losses = [row["train/loss"] for row in metrics_rows(run_dir) if "train/loss" in row]
        finite = all(loss == loss and abs(loss) != float("inf") for loss in losses)
        ok = done["exit_code"] == 0 and (self.plumbing or (len(losses) > 1 and finite and losses[-1] < losses[0]))
        return {"status": "ok" if ok else "failed", "losses": losses, **done}

    def fsdp_offload(self) -> dict:
        if not self.cuda:
            return {"status": "skipped", "reason": "no CUDA: FSDP's CPU offload needs a CUDA device"}
        run_dir = os.path.join(self.work, "fsdp_offload")
        done = self.run(trainer_command("llama", True, run_dir, ["strategy=fsdp", "strategy.cpu_offload=true"], steps=10))
        figures = perf_of(metrics_rows(run_dir))
        ok = done["exit_code"] == 0 and (self.plumbing or "tokens_per_s" in figures)
        return {"status": "ok" if ok else "failed", **figures, **done}

    def estimate(self) -> dict:
        rows = []
        for recipe in ("gpt", "llama"):
            estimate = self.run([sys.executable, "-m", "trainer", "estimate", f"recipe={recipe}", "precision=bf16-mixed",
                                 f"trainer.accelerator={'cuda' if self.cuda else 'cpu'}", *size_overrides(recipe, self.cuda)])
            estimated = estimate_total_gib(estimate["output_tail"])
            measured_gb = perf_of(metrics_rows(os.path.join(self.work, f"{recipe}_eager"))).get("peak_allocated_gb")
            measured = measured_gb * 1e9 / 2 ** 30 if measured_gb is not None else None
            ok = estimate["exit_code"] == 0 and (self.plumbing or estimated is not None)
            rows.append({"recipe": recipe, "status": "ok" if ok else "failed", "estimated_gib": estimated,
                         "max_memory_allocated_gib": measured,
                         "ratio": estimated / measured if estimated and measured else None, **estimate})
        return {"status": "ok" if all(r["status"] == "ok" for r in rows) else "failed", "rows": rows}

    def host_syncs(self) -> dict:
        done = self.run(self.own("syncs"))
        figures = _json_line(done["output_tail"]) or {}
        ok = done["exit_code"] == 0 and (self.plumbing or figures.get("syncs_per_quiet_step") == 0)
        return {"status": "ok" if ok else "failed", **figures, **done}


def _json_line(text: str) -> dict | None:
    """The last line of ``text`` that is a JSON object (what the helper modes print)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time (seconds)")
    parser.add_argument("--out", default=None, help="the result file (default bench/results/gpu_check.json; "
                                                    "without CUDA a temporary file)")
    parser.add_argument("--dry", action="store_true", help="tiny CPU runs even where CUDA is present")
    parser.add_argument("--plumbing", action="store_true", help="build every command and write the file; run nothing")
    parser.add_argument("--hand", metavar="RECIPE", choices=("gpt", "llama"), help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--syncs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and not args.dry and not args.plumbing
    if args.hand or args.syncs:  # one helper process: its figures as one JSON line
        print(json.dumps(hand_written(args.hand, cuda, args.compiled) if args.hand else probe_syncs(cuda)))
        return 0
    from _results import RESULTS, Recorder

    mode = "cuda" if cuda else "plumbing" if args.plumbing else "dry"
    if not cuda:
        print(("CUDA present, but " + ("--plumbing" if args.plumbing else "--dry") if torch.cuda.is_available() else "no CUDA") +
              f": {mode} mode, the CUDA parts skipped, each section's code path checked"
              f"{' without running anything' if args.plumbing else ' at tiny sizes on the CPU'}", flush=True)
    out = args.out or (os.path.join(RESULTS, "gpu_check.json") if cuda else
                       os.path.join(tempfile.mkdtemp(prefix="gpu_check_"), "gpu_check.json"))
    recorder = Recorder("gpu_check", {"mode": mode, "budget_s": args.budget_s, "sections": args.sections}, out)
    check = Check(cuda, args.plumbing, args.budget_s)
    results = {}
    for section in args.sections:
        if check.left() <= 0:
            results[section] = {"status": "skipped", "reason": f"the {args.budget_s:.0f} s budget was spent"}
        else:
            started = time.perf_counter()
            results[section] = {**getattr(check, section)(), "seconds": round(time.perf_counter() - started, 2)}
        result = results[section]
        print(f"{section:<14}{result['status']:<9}{result['seconds'] if 'seconds' in result else '':>8} s  "
              f"{result.get('reason', result.get('summary', ''))}", flush=True)
    recorder.write(results)
    if cuda:
        _print_speed(results.get("recipes", {}).get("rows", []))
    failed = [name for name, result in results.items() if result["status"] == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)} (the result file has each one's output)")
    return 1 if failed else 0


def _print_speed(rows: list[dict]) -> None:
    print(f"\n{'recipe':<7}{'contender':<14}{'variant':<15}{'tokens/s':>11}{'TFLOP/s':>9}{'MFU':>7}{'peak GB':>9}")
    for row in rows:
        mfu = row.get("mfu")
        print(f"{row['recipe']:<7}{row['contender']:<14}{row['variant']:<15}{row.get('tokens_per_s', 0):>11.0f}"
              f"{row.get('tflops_per_device', 0):>9.1f}{'' if mfu is None else format(mfu, '.3f'):>7}"
              f"{row.get('peak_allocated_gb') or 0:>9.1f}")


if __name__ == "__main__":
    sys.exit(main())
