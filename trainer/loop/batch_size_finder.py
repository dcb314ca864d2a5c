"""The batch-size finder (``trainer.auto_batch_size=true``): the largest per-rank micro-batch whose
measured training step fits a memory limit, agreed by every rank.

Rules:

- Measured, never predicted: each candidate runs two real training steps (trainer/loop/batch_size_trial.py)
  whose peak memory is measured (trainer/runtime/peak_memory.py): on CPU the live tensor bytes against
  ``auto_batch_size_limit_gb`` (required there); on CUDA ``max_memory_allocated`` against the limit
  (default: the device's memory), an out-of-memory error counting as over it.
- A candidate fits when its peak is at most the budget, ``limit x (1 - margin)``.
- The search grows the micro-batch in powers of two from the configured one until a trial is over the
  budget (or reaches ``auto_batch_size_max`` / the samples per rank of an epoch), then bisects between
  the last fit and the first miss. A configured size already over the budget is halved until one fits.
- Every rank decides together: each trial's (peak, over) is an all-reduce MAX, so all ranks pick the
  same size (a rank that hangs turns into the collective timeout's error). On CUDA under ddp / fsdp an
  out-of-memory error inside a step's collectives may leave the other ranks waiting: that is the
  collective timeout's error, not a caught miss (set ``auto_batch_size_limit_gb`` below the device's
  memory to keep the trials clear of it).
- The global batch: with ``data.global_batch_size`` set, the candidates are the micro-batches that
  divide ``global / data-parallel ranks`` and ``accumulate_grad_batches`` is adjusted to keep it;
  unset, accumulation stays and the global batch changes with the micro-batch. The log line says which.
- Trials put the run back as it was (weights, optimizer, random generators, data position): the
  run after the finder equals a run started with the chosen size.
- Strategies that run each micro-batch themselves (pipeline) and manual optimization are refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer.loop.step_limits import FitPlan, plan_fit
from trainer.runtime.seeding import derive_seed, seeded
from trainer.runtime.value_checks import is_int, require

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)
GIB = 2**30


@dataclass(frozen=True)
class AutoBatchSize:
    """The finder's settings (``trainer.auto_batch_size*``): ``enabled``; ``limit_gb`` (GiB: required on
    CPU; on CUDA None means the device's memory); ``margin`` (the fraction of the limit kept free);
    ``max_size`` (the largest micro-batch to try; None: no bound but the data)."""

    enabled: bool = False
    limit_gb: float | None = None
    margin: float = 0.1
    max_size: int | None = None

    @classmethod
    def from_arguments(cls, enabled: Any, limit_gb: Any, margin: Any, max_size: Any) -> AutoBatchSize:
        """The settings checked: each wrong value is an error naming it and what is allowed."""
        require(isinstance(enabled, bool), f"trainer.auto_batch_size must be true or false, got {enabled!r}")
        require(limit_gb is None or (isinstance(limit_gb, (int, float)) and not isinstance(limit_gb, bool) and limit_gb > 0),
                f"trainer.auto_batch_size_limit_gb must be a number > 0 (GiB) or null, got {limit_gb!r}")
        require(isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 <= margin < 1,
                f"trainer.auto_batch_size_margin must be a fraction in [0, 1), got {margin!r}")
        require(max_size is None or (is_int(max_size) and max_size >= 1),
                f"trainer.auto_batch_size_max must be an integer >= 1 or null, got {max_size!r}")
        return cls(enabled, None if limit_gb is None else float(limit_gb), float(margin), max_size)

    def check_strategy(self, strategy: Any) -> None:
        """Refuse, before any process starts, a strategy the finder cannot measure, and a CPU run without a limit."""
        if not self.enabled:
            return
        require(not strategy.owns_step,
                f"trainer.auto_batch_size=true is not supported with strategy={strategy.name}: it runs each "
                "micro-batch through its stages itself, which a trial of training_step would not measure; "
                "set data.batch_size by hand (the finder supports single, ddp (zero1 too) and fsdp)")
        require(strategy.use_cuda() or self.limit_gb is not None,
                "trainer.auto_batch_size=true on CPU needs trainer.auto_batch_size_limit_gb (GiB): the measured "
                "peak of a trial step's tensor memory is compared with it (on CUDA the device's memory is the default)")


def candidates_dividing(total: int, largest: int) -> list[int]:
    """The micro-batches that divide ``total`` (the global batch per rank), up to ``largest``."""
    return [n for n in range(1, min(total, largest) + 1) if total % n == 0]


def search(start: int, largest: int, allowed: list[int] | None, fits: Callable[[int], bool]) -> int | None:
    """The largest size for which ``fits`` is true, found with few calls: powers of two up from
    ``start``, then bisection. ``allowed``: the only allowed to try (sorted), else 1..``largest``.
    None when even the smallest size does not fit."""
    def up(n: int) -> int | None:  # the next size to grow to: 2n, or the nearest allowed above it
        if allowed is not None:
            above = [s for s in allowed if s >= 2 * n]
            return above[0] if above else (allowed[-1] if allowed[-1] > n else None)
        return min(2 * n, largest) if n < largest else None

    def down(n: int) -> int | None:  # half of n, or the nearest allowed below it
        if allowed is not None:
            below = [s for s in allowed if s <= n // 2]
            return below[-1] if below else None
        return n // 2 or None

    fit, miss = None, None
    if fits(start):
        fit = start
        while (bigger := up(fit)) is not None:
            if not fits(bigger):
                miss = bigger
                break
            fit = bigger
        if miss is None:
            return fit
    else:
        miss = start
        while (smaller := down(miss)) is not None:
            if fits(smaller):
                fit = smaller
                break
            miss = smaller
        if fit is None:
            return None
    between = [s for s in (allowed if allowed is not None else range(fit + 1, miss)) if fit < s < miss]
    while between:  # bisection: fit < every size left < miss
        middle = between[len(between) // 2]
        if fits(middle):
            fit, between = middle, [s for s in between if s > middle]
        else:
            between = [s for s in between if s < middle]
    return fit


class _Trials:
    """The trials of one search: each size's agreed (peak, over the budget), measured once."""

    def __init__(self, run: RankRun, budget: float):
        self.run, self.budget = run, budget
        self.results: dict[int, tuple[float, bool]] = {}

    def fits(self, size: int) -> bool:
        from trainer.loop.batch_size_trial import measure_trial

        if size not in self.results:
            peak, out_of_memory = measure_trial(self.run, size)
            over = out_of_memory or peak > self.budget
            # One all-reduce MAX per trial: the largest peak and "over on some rank", the same on every rank.
            agreed = self.run.strategy.all_reduce_max(torch.tensor([peak, float(over)], dtype=torch.float64,
                                                                    device=self.run.device))
            peak, over_anywhere = agreed.tolist()  # a host read at fit start, not on a training step
            self.results[size] = (peak, bool(over_anywhere))
        return not self.results[size][1]

    def describe(self) -> str:
        return ", ".join(f"{size} ({_size(peak)}{', over' if over else ''})"
                         for size, (peak, over) in self.results.items())


def _size(num_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps them >= 1 (4 significant digits)."""
    for unit, factor in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= factor:
            return f"{num_bytes / factor:.4g} {unit}"
    return f"{num_bytes:.0f} B"


def _limit_bytes(settings: AutoBatchSize, device: torch.device) -> float:
    if settings.limit_gb is not None:
        return settings.limit_gb * GIB
    return float(torch.cuda.get_device_properties(device).total_memory)


def find_batch_size(run: RankRun, fitting: FitPlan) -> FitPlan:
    """At fit start, after the optimizer exists and any resume: with ``trainer.auto_batch_size``, pick
    the micro-batch and return the fit's plan for it (``fitting`` itself when the finder is off or the
    split of the global batch stays as it was). The Trainer is not written: ``trainer.batch_size``
    reads the run's plan."""
    trainer, batch = run.trainer, fitting.batch
    settings = getattr(trainer, "auto_batch_size", None)
    if settings is None or not settings.enabled:
        return fitting
    if run.manual is not None:
        raise ValueError("trainer.auto_batch_size=true with manual optimization (automatic_optimization = False): "
                         "a trial step cannot call your training_step's own optimizer steps; set data.batch_size by hand")
    plan = fitting.plan
    if getattr(plan, "is_stream", False):
        raise ValueError("trainer.auto_batch_size=true with a streaming (iterable) training set: a trial reads samples by "
                         "index, which a stream has not; set data.batch_size by hand (or find it on a map-style copy)")
    data_parallel = run.data_parallel_size
    fixed_global = trainer.batch_arguments.global_batch_size is not None
    start = batch.batch_size
    largest = settings.max_size or (1 << 62)
    if fixed_global:
        allowed = candidates_dividing(batch.global_batch_size // data_parallel, largest)
    else:
        largest = min(largest, -(-plan.num_samples // data_parallel))  # one micro-batch holds a rank's whole epoch
        allowed = None
    start = start if allowed is None or start in allowed else allowed[-1]
    start = min(start, largest)
    limit = _limit_bytes(settings, run.device)
    trials = _Trials(run, limit * (1 - settings.margin))
    with seeded(derive_seed(trainer.seed, "auto_batch_size", run.rank)):  # the generators are put back after
        chosen = search(start, largest, allowed, trials.fits)
    budget = f"peak <= limit {_size(limit)} x (1 - margin {settings.margin:g}) = {_size(limit * (1 - settings.margin))}"
    if chosen is None:
        raise ValueError(f"trainer.auto_batch_size: no micro-batch fits the budget ({budget}); tried {trials.describe()}; "
                         "raise trainer.auto_batch_size_limit_gb, lower the margin, or shrink the model")
    return _apply(run, fitting, chosen, fixed_global, f"{trials.describe()}; fits when {budget}")


def _apply(run: RankRun, fitting: FitPlan, chosen: int, fixed_global: bool, tried: str) -> FitPlan:
    """The fit's plan for micro-batch ``chosen``, logged (``fitting`` when the split stays as it was)."""
    before = fitting.batch
    data_parallel = before.data_parallel_size
    if fixed_global:  # the global batch is kept: accumulation follows from the chosen micro-batch
        batch = before.with_micro_batch(chosen, before.global_batch_size // (chosen * data_parallel))
        rule = (f"data.global_batch_size={before.global_batch_size} kept: accumulate_grad_batches "
                f"{before.accumulate_grad_batches} -> {batch.accumulate_grad_batches}")
    else:
        batch = before.with_micro_batch(chosen, before.accumulate_grad_batches)
        rule = (f"data.global_batch_size unset: the global batch follows the micro-batch, {before.global_batch_size} -> "
                f"{batch.global_batch_size} (batch x accumulate {batch.accumulate_grad_batches} x {data_parallel} ranks)")
    changed = (batch.batch_size, batch.accumulate_grad_batches) != (before.batch_size, before.accumulate_grad_batches)
    new = plan_fit(run.trainer, run.module, run.data.plan(data_parallel, batch), batch) if changed else None
    if run.rank == 0:
        per_epoch = f", {new.steps_per_epoch} steps per epoch" if new is not None else ""
        log.info("auto_batch_size: micro-batch %d per rank (was %d); tried (size, agreed peak): %s; %s%s", chosen,
                 before.batch_size, tried, rule, per_epoch)
    if new is None:
        return replace(fitting, batch=batch)
    if run.epoch_step > new.plan.steps_per_epoch:
        raise ValueError(f"trainer.auto_batch_size: the resumed epoch position {run.epoch_step} is beyond the "
                         f"{new.plan.steps_per_epoch} steps per epoch of the global batch {batch.global_batch_size}; "
                         "set data.global_batch_size to the checkpoint's global batch")
    if run.rank == 0 and fitting.total_steps != new.total_steps and run.lr_scheduling.configs:
        log.warning("auto_batch_size changed the run's length from %s to %s optimizer steps after configure_optimizers "
                    "built the learning-rate schedulers: a schedule sized from trainer.estimated_stepping_batches "
                    "keeps the old length; set data.global_batch_size (or trainer.max_steps) for a fixed length",
                    fitting.total_steps, new.total_steps)
    return new
