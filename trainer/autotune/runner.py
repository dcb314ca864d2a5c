"""The search: candidates from the config, trials within the budget, the table and the best config."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from trainer.autotune import candidates as cands
from trainer.autotune.best_config import write_best_config
from trainer.autotune.budget import Budget, process_age_s
from trainer.autotune.settings import Job, load_job
from trainer.autotune.table import best, format_table
from trainer.autotune.trial import TrialResult, run_trial

BEST_NAME = "best"  # <out_dir>/best.yaml


@dataclass
class Outcome:
    """What a search produced: every row, the best one (None if none ran through) and the command
    that runs the best config (None likewise)."""

    results: list[TrialResult]
    best: TrialResult | None
    command: str | None
    out_dir: Path


def plan(job: Job) -> tuple[cands.GlobalBatch, list[cands.Candidate]]:
    """The global batch every candidate keeps, and the candidates."""
    settings, config = job.settings, job.config
    batch = cands.global_batch(config)
    micro = cands.micro_batch_sizes(settings.micro_batch_sizes, batch)
    if not micro:
        raise cands.AutotuneError(f"no micro-batch size keeps the global batch of {batch.size} on {batch.world} ranks")
    typed = config.trainer.activation_checkpointing if job.typed("trainer.activation_checkpointing") else None
    checkpointing = cands.checkpointing_options(settings.activation_checkpointing, typed,
                                                lambda: cands.model_has_blocks(config.module))
    tp = (cands.tensor_parallel_degrees(settings.tp_degrees, config.module, batch.world)
          if cands.TENSOR_PARALLEL in settings.strategies else [])
    return batch, cands.generate(settings.strategies, micro, checkpointing, batch, tp)


def run_candidates(candidates: list[cands.Candidate], job: Job, budget: Budget,
                   trial: Callable[..., TrialResult] = run_trial) -> list[TrialResult]:
    """Each candidate in turn, under a tqdm bar, while the budget says it can finish; the rest are
    rows ``not run: budget``. ``trial`` is `run_trial`'s signature (tests pass a fake)."""
    from tqdm import tqdm

    results: list[TrialResult] = []
    durations: list[float] = []
    with tqdm(total=len(candidates), desc="autotune", unit="candidate", file=sys.stderr, dynamic_ncols=True) as bar:
        for index, candidate in enumerate(candidates):
            if not budget.can_start(durations):
                results.append(TrialResult(candidate, "not run: budget"))
                bar.update()
                continue
            bar.set_postfix_str(candidate.label)
            run_dir = job.settings.out_dir / "trials" / f"{index:02d}_{candidate.strategy}_m{candidate.micro_batch_size}" \
                f"{'_ckpt' if candidate.activation_checkpointing else ''}"
            result = trial(candidate, job.overrides, job.settings, run_dir, budget.left())
            durations.append(result.seconds or 0.0)
            results.append(result)
            speed = result.status if not result.ok else f"{result.samples_per_s:.0f} samples/s" + (
                f", {result.peak_mb:.0f} MB" if result.peak_mb is not None else "")
            bar.write(f"{candidate.label}: {speed} ({result.seconds or 0.0:.1f} s)")
            bar.update()
    return results


def describe(job: Job, batch: cands.GlobalBatch, candidates: list[cands.Candidate]) -> str:
    s = job.settings
    tp_note = ""
    if cands.TENSOR_PARALLEL in s.strategies and not any(c.tp > 1 for c in candidates):
        tp_note = (f"; no tensor-parallel (nd) candidates: the module declares no tensor_parallel_plan() or accepts "
                   f"no degree dividing {batch.world}")
    elif any(c.tp > 1 for c in candidates):
        tp_note = (f"; an nd_tp<T> candidate's T ranks share their samples: {batch.world} / T data-parallel ranks, "
                   "T times the accumulation")
    return (f"autotune: {len(candidates)} candidates, budget {s.budget_s:g} s, {s.warmup_steps} warm-up + {s.steps} "
            f"measured steps each; every candidate trains the same global batch of {batch.describe()}. Trials run "
            f"without checkpoints, callbacks, validation (one batch at the end) and loggers but jsonl; your settings of "
            f"those go into the best config unchanged{tp_note}")


def autotune(argv: list[str], trial: Callable[..., TrialResult] = run_trial) -> Outcome:
    """The whole search for ``python -m trainer.autotune <argv>``; prints the table and the command."""
    age = process_age_s()  # the budget counts from the process start
    job = load_job(argv)
    budget = Budget(job.settings.budget_s, already_spent=age)
    batch, candidates = plan(job)
    print(describe(job, batch, candidates), flush=True)
    results = run_candidates(candidates, job, budget, trial)
    out_dir = job.settings.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{BEST_NAME}.yaml").unlink(missing_ok=True)  # an earlier search's, in a reused out_dir
    table = format_table(results)
    memory = next((r.memory for r in results if r.memory), None)
    notes = (f"global batch {batch.describe()}, the same in every row; samples/s over the steps after the warm-up"
             + (f"; peak MB: {memory}" if memory else ""))
    (out_dir / "table.txt").write_text(table + "\n" + notes + "\n", encoding="utf-8")
    (out_dir / "results.json").write_text(json.dumps([_record(r) for r in results], indent=1) + "\n", encoding="utf-8")
    print(table)
    print(notes)
    top = best(results)
    command = None
    if top is None:
        print("no candidate ran through: no best config written (see the result column and each trial's "
              f"autotune_trial.log under {out_dir / 'trials'})")
    else:
        c = top.candidate
        comment = (f"Written by trainer autotune {' '.join(argv)}\n"
                   f"Best of {len(results)} candidates: {c.label}, {top.samples_per_s:.0f} samples/s\n"
                   f"Run it as is: python -m trainer --config-path {out_dir} --config-name {BEST_NAME}")
        command = write_best_config(out_dir / f"{BEST_NAME}.yaml", job.overrides + c.overrides(), comment)
        print(f"best: {c.label}; its config: {out_dir / (BEST_NAME + '.yaml')}\nrun it with: {command}")
    print(f"autotune took {budget.elapsed():.0f} s of its {budget.seconds:g} s budget")
    return Outcome(results, top, command, out_dir)


def _record(result: TrialResult) -> dict:
    record = asdict(result)
    record["candidate"] = asdict(result.candidate)
    return record
