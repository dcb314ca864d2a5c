"""What only ``fit`` adds to a rank's run, after ``build_run``, in this order:

1. the plan: the training set's global batches, the epoch length, when to validate, the stop rule
   (``trainer.estimated_stepping_batches`` is known from here: ``configure_optimizers`` may read it);
2. optimizers and schedulers (``configure_optimizers``, set up by the strategy: ZeRO-1's wrapper; the
   ``ManualStep`` under manual optimization);
3. the checkpoint manager, the resume (which restores into the parts built so far);
4. the batch-size finder (``trainer.auto_batch_size``: it may choose another split of the batch);
5. fp16 steps, the summary's counts, observers, the non-finite check: fp16's sync-free steps (after
   the resume: the scaler's counts), the model summary's per-rank counts, the observers (throughput,
   the wall-clock breakdown, the profiler and comms windows), the late non-finite check;
6. the training step (a ``TrainStep``, or the ManualStep's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint import CheckpointManager
from trainer.loop.batch_size_finder import find_batch_size
from trainer.loop.manual_step import setup_optimizers
from trainer.loop.optimizer_step import gradient_clipper
from trainer.loop.resume import restore_run
from trainer.loop.step_accounting import NonfiniteLossWatch
from trainer.loop.step_limits import epoch_cap, plan_fit
from trainer.loop.stream_limits import describe_epoch
from trainer.loop.train_step import TrainStep
from trainer.api.errors import MisconfigurationException
from trainer.api.trainer_arguments import validates_during_training
from trainer.observe.model_summary import count_local
from trainer.observe.profiling import TraceWindow, WallClockBreakdown
from trainer.observe.throughput import Throughput
from trainer.optim.lr_scheduling import LRScheduling
from trainer.optim.optimizers import configure_optimizers
from trainer.precision.fp16_step import Fp16Steps
from trainer.runtime import distributed
from trainer.runtime.comms_log import CommsLog
from trainer.runtime.rank_logging import rank_zero_user_warning

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


def build_fit(run: RankRun) -> None:
    """Install ``fit``'s parts into ``run`` in the order of the module docstring."""
    trainer, module = run.trainer, run.module
    # 1. the plan
    fitting = plan_fit(trainer, module, run.data.plan(run.data_parallel_size, run.batch), run.batch)
    run.replan(run.batch, fitting)
    # 2. optimizers and schedulers
    steps_schedulers = run.hooks.module_overrides("lr_scheduler_step")  # the module steps each scheduler itself
    optimizer, schedulers = configure_optimizers(module, steps_schedulers)  # also: an optimizer= given and ignored
    lr_scheduling = LRScheduling(schedulers)
    if steps_schedulers:
        lr_scheduling.step_scheduler = module.lr_scheduler_step
    if module.automatic_optimization:  # self.clip_gradients in configure_gradient_clipping
        module.__dict__["_gradient_clipper"] = gradient_clipper(run)
    lr_scheduling.known_names = run.module_logs.known_names  # ReduceLROnPlateau on self.log names
    lr_scheduling.check_fit(run.validates, validates_during_training(trainer), run.rank)
    optimizer, manual = setup_optimizers(run, optimizer, schedulers)
    # 3. the checkpoint manager, the resume
    checkpoints = None
    if trainer.checkpoint is not None and trainer.checkpoint.enabled:
        checkpoints = CheckpointManager(trainer.checkpoint, run.run_dir, run.strategy)
        checkpoints.setup()
    run.install(optimizer=optimizer, lr_scheduling=lr_scheduling, manual=manual, checkpoints=checkpoints)
    plan = fitting.plan
    if run.rank == 0 and (short := plan.short_of_one_batch()):  # every rank would say it alike
        log.warning(short)
    log.info("strategy %s, world size %d, global batch %s, %s, %s, run dir %s", run.strategy.name,
             distributed.world_size(), plan.describe_global_batch(), describe_epoch(plan, fitting.steps_per_epoch),
             fitting.limits.describe_total(), run.run_dir)
    restore_run(run, plan)
    # 4. the batch-size finder
    fitting = find_batch_size(run, fitting)
    run.replan(fitting.batch, fitting)
    fitting.limits.note_schedules(run)
    epochs, done = epoch_cap(trainer), run.epoch + (run.epoch_step >= fitting.steps_per_epoch > 0)  # (epochs ended)
    if getattr(trainer, "refuses_resume_past_max_epochs", False) and run.step > 0 and epochs is not None \
            and done > epochs:  # (Lightning's Trainer: an error; every rank alike)
        raise MisconfigurationException(
            f"You restored a checkpoint with current_epoch={done}, past Trainer(max_epochs={trainer.max_epochs}): "
            "fit(ckpt_path=...) would train nothing; raise max_epochs to continue the run")
    if getattr(trainer, "lightning_warnings", False):
        _warn_short_epoch(trainer, fitting.steps_per_epoch)
    if run.rank == 0 and run.step > 0 and fitting.limits.done(run):  # resumed where this run's limits end it
        log.warning("resumed at step %d, epoch %d, where this run's limits (trainer.max_steps=%s, trainer.max_epochs=%s) "
                    "already end it: nothing is trained; raise them to continue the run", run.step, run.epoch,
                    trainer.max_steps, trainer.max_epochs)
    # 5. fp16 steps, the summary's counts, observers, the non-finite check
    precision, device = run.precision, run.device
    if run.summary is not None:
        count_local(run.summary, module)  # each rank's share (one gather, at the start only)
        if run.rank == 0:
            log.info("model summary:\n%s", run.summary.table())
    profile = trainer.profile
    run.install(
        fp16=Fp16Steps(precision.scaler, run.strategy, optimizer, run.rank) if precision.scaler is not None else None,
        throughput=Throughput(device, distributed.world_size(), precision.compute_dtype != torch.float32),
        breakdown=WallClockBreakdown(profile["wall_clock_breakdown"], device),
        trace=TraceWindow(profile["trace_steps"], run.run_dir, run.rank, device),
        comms=CommsLog(profile["comms_steps"], run.run_dir, run.rank),
        # fp16: an inf loss is an overflow (skipped), a NaN one an error
        nonfinite=NonfiniteLossWatch(device, nan_only=precision.scaler is not None)
        if trainer.nonfinite_loss == "error" else None,
    )
    # 6. the training step
    run.install(train_step=manual.train_step if manual is not None else TrainStep(run))


def _warn_short_epoch(trainer: Any, steps_per_epoch: int | float) -> None:
    """Lightning's warning (the mirror's Trainer gives it) where an epoch has fewer steps than
    ``log_every_n_steps``, with a logger and outside ``fast_dev_run``: an epoch may then log no
    training step."""
    every = trainer.log_every_n_steps
    if trainer.logger_specs and not trainer.fast_dev_run and steps_per_epoch < every:
        rank_zero_user_warning(log, True, (
            f"The number of training batches ({steps_per_epoch}) is smaller than the logging interval "
            f"log_every_n_steps={every}: an epoch may pass without a logged training step; set a lower "
            "log_every_n_steps to see each epoch's"))
