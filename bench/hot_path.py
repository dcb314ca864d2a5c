"""Host syncs and collectives per training step, per strategy: a quiet step next to a logging step.

    python bench/hot_path.py [--layouts single ddp fsdp_full fsdp_grad_op pipeline] [--precisions fp32 fp16-mixed]

Each layout runs the hot-path tests' kind of run (a tiny token model, 8 steps logged every 4,
``loss_normalization=tokens``, checkpoints every 4 steps with ``save_on_signal`` on, 2 micro-batches
per step, 2 ranks except ``single``) with trainer/observe/host_syncs.py's ``HotPathProbe``, which counts host
syncs (``aten._local_scalar_dense`` and ``.tolist()`` / ``.numpy()`` / device ``.cpu()``) and
collectives by kind between consecutive step ends. It prints, for rank 0, the largest count over
the quiet steps (3, 6, 7: neither logging steps nor right after one) and the counts of logging
step 4 (whose window also holds step 4's save), with the callers of the host syncs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]  # (spawned workers unpickle _token_modules' class)

LOG_EVERY = 4
STEPS = 8
QUIET = [k for k in range(3, STEPS + 1) if k % LOG_EVERY not in (0, 1)]  # not a logging step, nor right after one
LAYOUTS = {  # name: (strategy, devices)
    "single": ("single", 1),
    "ddp": ("ddp", 2),
    "fsdp_full": ({"name": "fsdp", "sharding": "full"}, 2),
    "fsdp_grad_op": ({"name": "fsdp", "sharding": "grad_op"}, 2),
    "pipeline": ({"name": "pipeline", "microbatches": 2}, 2),
}


def probe(run_dir: str, layout: str, precision: str, fused: bool) -> list[dict[int, dict]]:
    """One run of ``layout``; every rank's per-step windows."""
    from _token_modules import TokenCounts

    from trainer import Trainer
    from trainer.observe.host_syncs import HotPathProbe, read_hot_path
    from trainer.precision import Precision
    from trainer.strategies import resolve_strategy

    strategy, devices = LAYOUTS[layout]
    if isinstance(strategy, dict):
        options = dict(strategy)
        strategy = resolve_strategy(options.pop("name"), **options)
    if precision == "fp16-mixed":  # 2**16 overflows at first here: a skipped step costs the same
        precision = Precision("fp16-mixed", initial_scale_power=8)
    Trainer(strategy=strategy, devices=devices, accumulate_grad_batches=2, batch_size=4, max_steps=STEPS,
            log_every_n_steps=LOG_EVERY, loss_normalization="tokens", precision=precision, callbacks=[HotPathProbe()],
            checkpoint=dict(every_n_steps=LOG_EVERY), loggers=[], progress_bar=False, enable_model_summary=False,
            run_dir=run_dir).fit(TokenCounts(fused=fused))
    return read_hot_path(run_dir, devices)


def _summary(windows: dict[int, dict], steps: list[int]) -> tuple[int, dict[str, int], list[str]]:
    """The most syncs, the most collectives of each kind and the sync callers over ``steps``' windows."""
    syncs = max(windows[s]["syncs"] for s in steps)
    kinds: dict[str, int] = {}
    where: set[str] = set()
    for s in steps:
        where.update(windows[s]["where"])
        for kind, count in windows[s]["collectives"].items():
            kinds[kind] = max(kinds.get(kind, 0), count)
    return syncs, kinds, sorted(where)


def _kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    # fp16-mixed: with a fused AdamW (sync-free step); fp16-sgd: fp16 with a plain SGD (one host read)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16-mixed", "fp16-sgd"],
                        choices=["fp32", "fp16-mixed", "fp16-sgd"])
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; rank 0, per step window; "
          f"quiet steps {QUIET}, logging step {LOG_EVERY} (with a checkpoint save)")
    print(f"{'layout':<14}{'precision':<12}{'quiet syncs':>12}  {'quiet collectives':<40}{'log syncs':>10}  logging-step collectives")
    for layout in args.layouts:
        for precision in args.precisions:
            with tempfile.TemporaryDirectory() as run_dir:
                ranks = probe(run_dir, layout, "fp16-mixed" if precision == "fp16-sgd" else precision,
                              fused=precision == "fp16-mixed")
            windows = ranks[0]
            quiet_syncs, quiet_kinds, quiet_where = _summary(windows, QUIET)
            log_syncs, log_kinds, _ = _summary(windows, [LOG_EVERY])
            print(f"{layout:<14}{precision:<12}{quiet_syncs:>12}  {_kinds(quiet_kinds):<40}{log_syncs:>10}  {_kinds(log_kinds)}")
            if quiet_where:
                print(f"{'':<26}quiet syncs from: {', '.join(quiet_where)}")


if __name__ == "__main__":
    main()
