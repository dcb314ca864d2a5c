"""When ``fit`` stops, and what counts toward it, in Lightning's units.

``trainer.global_step`` counts optimizer steps (as Lightning). Under automatic
optimization one global batch is one optimizer step, so batches and ``global_step`` are the same
number. Under manual optimization (``automatic_optimization = False``) every ``opt.step()`` the
module makes through ``self.optimizers()`` adds one (an fp16 step skipped for an overflow too, as
Lightning counts it): a GAN stepping two optimizers per batch reaches ``global_step`` 6 after 3
batches. There:

- ``max_steps`` compares with ``global_step``: the run stops after the batch in which it reaches
  (or passes) ``max_steps``, as Lightning's loop does;
- ``max_epochs`` / ``limit_train_batches``, ``log_every_n_steps``, an int ``val_check_interval``,
  the logged step axis, checkpoint folder names and the data position count batches (Lightning
  logs against its batches that stepped);
- the last batch is a logging step when it can be foreseen: a batch is taken as the last one when
  the optimizer steps of the batch before it would reach ``max_steps`` (the first batch: one step
  per optimizer). A module that steps the same number of times in every batch (a GAN) is foreseen
  exactly; otherwise the run still stops at the right batch, that batch may just not be logged;
- every rank must call ``opt.step()`` the same number of times (the gradient sync needs it anyway):
  each rank counts its own calls; the counts are compared after the first batch and on logging steps,
  and unequal ones raise on every rank, naming each rank's count (trainer/loop/step_counts.py);
- ``trainer.estimated_stepping_batches`` is ``max_steps`` when only ``max_steps`` bounds the run;
  with an epoch bound the optimizer steps of those epochs are unknown before they run, so it is an
  error saying so (not a batch count that a schedule would take for optimizer steps);
- a learning-rate schedule whose length equals ``max_steps`` (``scheduler=warmup_cosine`` follows
  ``trainer.max_steps``) but that the module steps fewer times than that (one scheduler step per
  batch, several optimizer steps per batch) gets one warning after the first batch, with the length
  it would need.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.api.batch_settings import BatchSettings
from trainer.data.batch_plan import GlobalBatchPlan
from trainer.loop.val_schedule import ValSchedule
from trainer.optim.schedules import schedule_length
from trainer.runtime.rank_logging import rank_zero_warn

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitPlan:
    """What fit's global-batch plan and the run's limits make: read by the loop, replaced only when the
    batch-size finder picks another micro-batch (``RankRun.replan``)."""

    plan: GlobalBatchPlan  # the training set's global batches (or a stream's plan)
    batch: BatchSettings  # the micro-batch, accumulation and global batch the plan is made of
    steps_per_epoch: int | float  # optimizer steps per epoch at most (limit_train_batches; inf: a stream)
    val_every_n_steps: int | None  # validate every this many steps (a float val_check_interval resolved)
    val_schedule: ValSchedule  # where those validations and the epoch ends' fall (trainer/loop/val_schedule.py)
    limits: StepLimits  # the stop rule
    total_steps: int | str  # trainer.estimated_stepping_batches (a str: why it is unknown)


def plan_fit(trainer: Any, module: Any, plan: GlobalBatchPlan, batch: BatchSettings) -> FitPlan:
    """What follows from fit's plan: the epoch length, when to validate, the stop rule and the steps."""
    from trainer.loop.stream_limits import epoch_length, step_limits  # (it builds on StepLimits)

    # limit_train_batches, a float val_check_interval (a stream: epochs end where it does, trainer/data/streaming/)
    steps_per_epoch, val_every_n_steps = epoch_length(trainer, plan)
    val_schedule = ValSchedule(trainer, val_every_n_steps, steps_per_epoch)  # (Lightning's: counted in each epoch)
    # max_steps counts optimizer steps: under manual optimization not batches
    limits = step_limits(trainer, plan, steps_per_epoch, manual=not getattr(module, "automatic_optimization", True))
    return FitPlan(plan, batch, steps_per_epoch, val_every_n_steps, val_schedule, limits,
                   limits.estimated_stepping_batches(trainer))


def epoch_cap(trainer: Any) -> int | None:
    """``trainer.max_epochs`` as a bound: None for none (None, or -1 as Lightning's Trainer gives it),
    else the epochs (0: nothing is trained)."""
    epochs = trainer.max_epochs
    return None if epochs is None or epochs == -1 else epochs


class StepLimits:
    """The stop rule of one fit (see the module docstring); ``manual``: the module steps its
    optimizers itself, so ``global_step`` is not the batch count."""

    def __init__(self, trainer: Any, steps_per_epoch: int, manual: bool):
        self.manual = manual
        epochs = epoch_cap(trainer)
        epoch_limit = steps_per_epoch * epochs if epochs is not None else math.inf
        if steps_per_epoch == 0:  # limit_train_batches=0: fit trains nothing (not endless empty epochs)
            epoch_limit = 0
        self.max_steps = trainer.max_steps if trainer.max_steps > 0 else math.inf  # global_step units
        # Batches: under automatic optimization max_steps is a batch count too.
        self.batches = epoch_limit if manual else min(epoch_limit, self.max_steps)
        self.epoch_bound = epoch_limit != math.inf
        # Epochs counted as they end too: an epoch cut short (on_train_batch_start returned -1) has fewer steps.
        self.max_epochs, self.steps_per_epoch = (epochs if self.epoch_bound else None), steps_per_epoch
        self._per_batch: int | None = None  # optimizer steps of the last batch (manual)
        self._before = 0  # global_step before the current batch
        self._shown = 0  # the progress bar's position
        self._schedules: list[tuple[Any, int, int]] | None = None  # (scheduler, length, its steps before)

    # ----- up front ---------------------------------------------------------------------------------------
    def estimated_stepping_batches(self, trainer: Any) -> int | str:
        """Optimizer steps this fit runs, or why it cannot be known up front (a str)."""
        if not self.manual:
            return int(self.batches)
        if not self.epoch_bound:
            return int(self.max_steps)
        return (f"trainer.estimated_stepping_batches under manual optimization with trainer.max_epochs="
                f"{trainer.max_epochs} ({int(self.batches)} batches): the optimizer steps of those epochs depend on "
                "how often training_step calls opt.step(), unknown before they run; bound the run by "
                "trainer.max_steps alone (max_epochs=null), or size the schedule from the batch count "
                "(max_epochs x batches per epoch) and your steps per batch")

    def progress_total(self) -> int | None:
        """The progress bar's total: optimizer steps when ``max_steps`` bounds a manual run, else batches."""
        if self.manual and not self.epoch_bound:
            return None if self.max_steps == math.inf else int(self.max_steps)
        return None if self.batches == math.inf else int(self.batches)

    def progress_position(self, run: RankRun) -> int:
        self._shown = run.global_step if self.manual and not self.epoch_bound else run.step
        return self._shown

    def describe_total(self) -> str:
        """For the log line at fit start: how long the run is."""
        if not self.manual:
            return f"{int(self.batches)} steps"
        parts = [] if self.batches == math.inf else [f"{int(self.batches)} batches"]
        if self.max_steps != math.inf:
            parts.append(f"until global_step (the module's optimizer steps) reaches {int(self.max_steps)}")
        return " or ".join(parts)

    def describe(self, run: RankRun) -> str:
        """For a logging step's line: ``step/total``; a manual run adds its global_step."""
        total = "" if self.batches == math.inf else f"/{int(self.batches)}"
        if not self.manual:
            return f"{run.step}{total}"
        bound = "" if self.max_steps == math.inf else f"/{int(self.max_steps)}"
        return f"{run.step}{total} (global_step {run.global_step}{bound})"

    # ----- per batch ----------------------------------------------------------------------------------------
    def done(self, run: RankRun) -> bool:
        """Whether the run has reached its end (checked before each batch)."""
        return (run.step >= self.batches or (self.manual and run.global_step >= self.max_steps)
                or (self.max_epochs is not None and run.epoch >= self.max_epochs))

    def before_batch(self, run: RankRun) -> bool | None:
        """Before a batch: None when the run has reached its end (`done`), else whether the batch is
        the last one (a logging step). Automatic: known exactly."""
        self._before = run.global_step
        if self.done(run):
            return None
        if run.step + 1 >= self.batches or (self.max_epochs is not None and run.epoch + 1 >= self.max_epochs
                                            and run.epoch_step + 1 >= self.steps_per_epoch):
            return True
        if not self.manual:
            return False
        if self._per_batch is None:
            self._per_batch = max(1, len(run.manual.optimizers))
        return run.global_step + self._per_batch >= self.max_steps

    def after_batch(self, run: RankRun) -> int:
        """After a batch: the global_step before it (for "a multiple reached or crossed" triggers);
        the progress bar's advance is `advance`."""
        if self.manual:
            self._per_batch = run.global_step - self._before
            if self._schedules is not None:  # once, after the first batch
                self._check_schedules(run)
        return self._before

    def advance(self, run: RankRun) -> int:
        """How far the progress bar moves for the batch just run."""
        shown = self._shown
        return self.progress_position(run) - shown

    # ----- schedules tied to max_steps (manual) --------------------------------------------------------------
    def note_schedules(self, run: RankRun) -> None:
        """At fit start (after a resume): the schedules whose length is ``max_steps``, to check after
        the first batch how often the module steps them."""
        if not self.manual or self.max_steps == math.inf:
            return
        self._schedules = [(config.scheduler, length, config.scheduler.last_epoch)
                           for config in run.lr_scheduling.configs
                           if (length := schedule_length(config.scheduler)) == self.max_steps
                           and isinstance(getattr(config.scheduler, "last_epoch", None), int)]

    def _check_schedules(self, run: RankRun) -> None:
        schedules, self._schedules = self._schedules or [], None
        per_batch = self._per_batch
        if not per_batch:
            return
        batches = math.ceil((self.max_steps - self._before) / per_batch)  # this run's batches from here
        for scheduler, length, before in schedules:
            stepped = scheduler.last_epoch - before  # the scheduler's steps in this batch
            will_reach = scheduler.last_epoch + stepped * (batches - 1)
            if stepped and will_reach < length:
                rank_zero_warn(
                    log, "%s spans %d steps (trainer.max_steps=%d), but under manual optimization max_steps counts "
                    "every opt.step() (%d in the first batch) and the module steps this scheduler %d time(s) per batch: "
                    "the run ends after about %d of its %d steps; give the schedule a length of %d (e.g. "
                    "scheduler.total_steps=%d) to follow it to its end", type(scheduler).__name__, length,
                    int(self.max_steps), per_batch, stepped, will_reach, length, will_reach, will_reach,
                )
