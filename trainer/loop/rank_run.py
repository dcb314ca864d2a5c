"""The loop one rank runs: set-up, then ``fit`` in the order of trainer/api/module.py's pseudocode. One step:
trainer/loop/train_step.py (manual optimization: manual_optimization.py); validation: trainer/loop/validation.py.

Names: ``module`` is the user's TrainModule, ``wrapped`` what ``strategy.wrap(module)`` returned (what a
training step calls; Lightning's public ``trainer.model``), ``data_parallel_size`` the ranks that load
different samples (``strategy.data_parallel_size()``, by which the gradient sync averages).

A non-logging step makes no host sync and no collective but the gradient ones (FSDP's gathers,
pipeline sends, ZeRO-1's broadcast included), the grad-norm all-reduce when clipping and the token
count all-reduce with ``loss_normalization=tokens`` (tests/test_hot_path.py counts them). Logging
steps reduce the metrics (one all-reduce), settle the late non-finite check (trainer/loop/step_accounting.py;
also before validation and saves) and agree on preemption signals (also every
``checkpoint.signal_check_every_n_steps``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Iterable

import torch

from trainer.runtime import distributed
from trainer.loop.batch_size_finder import find_batch_size
from trainer.callbacks import CallbackList
from trainer.checkpoint import CheckpointManager, load_weights
from trainer.checkpoint.run_states import RunStates
from trainer.loop.resume import restore_run
from trainer.runtime.comms_log import CommsLog
from trainer.data.batch_plan import GlobalBatchPlan
from trainer.runtime.seeding import derive_seed, seed_everything
from trainer.api.hparams import for_loggers, merged_for_loggers
from trainer.api.hparams_archive import HparamsArchive, hparams_name
from trainer.api.hparams_display import checkpoint_record
from trainer.runtime.launch import ClusterEnvironment
from trainer.loggers import JSONLLogger, Logger, agree_versions
from trainer.optim.lr_scheduling import LRScheduling
from trainer.loop.hooks import RunHooks
from trainer.loop.optimizer_step import gradient_clipper
from trainer.loop.manual_step import setup_optimizers
from trainer.runtime.metric_sums import format_metrics
from trainer.observe.model_summary import count_local, summarize
from trainer.api.hook_calls import call_module_hook
from trainer.loop.log_collector import LogCollector
from trainer.optim.optimizers import configure_optimizers
from trainer.precision.fp16_step import Fp16Steps
from trainer.observe.profiling import TraceWindow, WallClockBreakdown
from trainer.observe.progress import ProgressBar
from trainer.runtime.rank_logging import log_to_file, rank_zero_warn
from trainer.api.run_view import RunView
from trainer.api.trainer_arguments import validates_during_training
from trainer.loop.counters import RunCounters
from trainer.loop.step_counts import FirstBatchCheck
from trainer.loop.stop_flag import StopFlag
from trainer.loop.step_limits import plan_limits
from trainer.loop.stream_limits import describe_epoch, epoch_over, training_batches
from trainer.loop.sanity_check import run_sanity_check
from trainer.strategies.speedups import apply_activation_checkpointing, compile_blocks
from trainer.loop.step_accounting import NonfiniteLossWatch
from trainer.observe.throughput import Throughput
from trainer.loop.train_step import TrainStep
from trainer.data.user_loader import RunData
from trainer.loop.validation import check_validation_setup, run_validation
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import select_units

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)


class _Run(RunCounters):
    """State of one fit/validate on one rank."""

    def __init__(self, trainer: Trainer, module: TrainModule, env: ClusterEnvironment, own_log_handler: bool):
        self.trainer = trainer
        self.own_log_handler = own_log_handler
        self.module = module
        self.env = env
        self.strategy = trainer.strategy
        self.loggers: list[Logger] = []
        self.rank = env.rank
        RunCounters.__init__(self)  # step, epoch, epoch_step, batch_idx, global_step: changed there only
        self.preempted = False
        self.checkpoints: CheckpointManager | None = None
        self.optimizer: Any = None  # a list of them under manual optimization with several
        self.manual: Any = None  # automatic_optimization = False: trainer/loop/manual_step.py
        self.fp16: Fp16Steps | None = None  # fp16-mixed: the optimizer step's overflow handling
        self.train_step: Any = None  # one optimizer step: a TrainStep (trainer/loop/train_step.py), or manual's
        self.lr_scheduling = LRScheduling()  # the schedulers and when they step
        self.nonfinite: NonfiniteLossWatch | None = None  # trainer.nonfinite_loss=error: settled late
        self.last_metrics: dict[str, float] = {}
        self.view = RunView(self)  # what callbacks, the Trainer's properties and tools read
        self.callbacks = CallbackList(trainer.callbacks, trainer, module, self.view)
        self.stop_flag = StopFlag()  # trainer.should_stop = True (trainer/api/run_state.py)
        self.total_steps: int | None = None  # trainer.estimated_stepping_batches, known in fit
        self.summary = None  # the model summary, counted before the strategy splits the model
        self.sanity_checking = False  # the sanity validation is running (trainer.sanity_checking)
        #: what runs now: "train", "sanity_check", "validate", "test", "predict" (trainer.state.stage); None between
        self.running_stage: str | None = None
        self.ends_epoch = False  # the step being trained is the epoch's last
        self.num_training_batches: int | float = 0  # this rank's micro-batches per epoch (Lightning's count)
        self.num_val_batches: list[int] = []  # this rank's batches of the current / last validation pass
        self.hparams_archive: HparamsArchive | None = None  # rank 0 of a fit that checkpoints

    # ----- set-up -----------------------------------------------------------------------------------
    def setup(self) -> None:
        trainer, module, strategy = self.trainer, self.module, self.strategy
        strategy.setup_environment(self.env, trainer.collective_timeout)
        self.device = strategy.device
        self.rank = distributed.rank()
        self.data_parallel_size = strategy.data_parallel_size()  # ranks loading different samples
        self.data_rank = strategy.data_parallel_rank  # which samples this rank loads
        # Under torchrun every rank built its own Trainer: rank 0's run directory wins.
        self.run_dir = trainer.run_dir = distributed.broadcast_object(trainer.run_dir)
        if self.rank == 0:
            os.makedirs(self.run_dir, exist_ok=True)
            if self.own_log_handler:
                log_to_file(os.path.join(self.run_dir, "train.log"))
        module._trainer = trainer
        if self.rank == 0 and trainer.stage == "fit" and trainer.checkpoint is not None and trainer.checkpoint.enabled:
            # The objects among the hyperparameters, pickled for the checkpoints before the strategy changes the model.
            self.hparams_archive = HparamsArchive({"module": module, "datamodule": trainer.datamodule})
        logged_hparams = merged_for_loggers(module, trainer.datamodule)  # every rank: a clash fails them all alike
        trainer._run_view = self.view  # the run-state properties read this run (trainer/api/run_state.py)
        refused = "not supported under strategy=pipeline; return the metric from pipeline_loss" if strategy.owns_step else None
        self.module_logs = module._log_collector = LogCollector(self.device, refused, module)  # self.log's values
        self.callbacks.add_configured(module.configure_callbacks())
        self.hooks = RunHooks(trainer, module, trainer.datamodule, self.callbacks)
        with distributed.rank_zero_first(local=True) as first:
            if first:
                if trainer.datamodule is not None:
                    trainer.datamodule.prepare_data()
                module.prepare_data()
        # Seeded right before setup and the build so every rank builds the same weights (prepare_data
        # ran on some ranks only and may have drawn random numbers); the datamodule's setup has its own seed.
        seed_everything(trainer.seed)
        self.hooks.call("setup", trainer.stage)  # datamodule, callbacks, module (every rank)
        strategy.before_configure_model(module)  # (nd: module.device_mesh)
        with strategy.init_context():
            module.configure_model()
        init = WeightInit(module, trainer.seed)
        if not has_meta_tensors(module):
            module.to(self.device)
            init.eager()
        self.precision = trainer.precision
        self.precision.convert_module(module)
        strategy.configure_precision(self.precision)
        strategy.parallelize(module)  # tensor parallel: before checkpointing, compile and sharding (torchtitan's order)
        if trainer.activation_checkpointing or trainer.compile:
            blocks = select_units(module, "auto", module.block_classes())
            if trainer.activation_checkpointing:
                apply_activation_checkpointing(module, blocks)
            if trainer.compile:
                compile_blocks(module, blocks)
        if trainer.sync_batchnorm:
            from trainer.strategies.sync_batchnorm import convert_sync_batchnorm, warn_if_nothing_to_sync

            warn_if_nothing_to_sync(module, self.data_parallel_size)

            # After the build and on its device (CUDA batch norms become torch's nn.SyncBatchNorm),
            # before wrapping, so DDP / FSDP register the synchronised layers. The default group is
            # the data-parallel group of DDP and FSDP (hybrid included).
            convert_sync_batchnorm(module, process_group=None)
        self.datasets()  # before wrapping: resolves trainer.batch_size (a strategy may need it)
        if trainer.enable_model_summary:
            self.summary = summarize(module)
        self.wrapped = strategy.wrap(module, init)  # materialises a meta-device build, unit by unit
        # Different random streams per rank from here on (dropout; also each pipeline stage's own), one per
        # tensor-parallel group (strategy.random_stream_rank). Loading draws from its own per-batch seeds,
        # keyed by the data-parallel rank (self.loader).
        seed_everything(derive_seed(trainer.seed, "rank", strategy.random_stream_rank))
        trainer.model = self.wrapped
        if trainer.init_from is not None:
            load_weights(trainer.init_from, module, part_of_model=strategy.owns_step)  # pipeline: this rank's stages
        # Every rank holds the logger objects (self.logger on a module); rank 0's write (self.loggers).
        agree_versions(trainer.logger_objects(self.run_dir))
        if self.rank == 0:
            source = getattr(trainer, "ckpt_path", None) or trainer.resume  # (fit's ckpt_path= or trainer.resume)
            if source not in (None, "auto", "last", "best"):
                # Resumed into a new run directory: the W&B run of the checkpoint's run goes on.
                from trainer.loggers.wandb_logger import adopt_run_of_checkpoint

                adopt_run_of_checkpoint(source, self.run_dir)
            self.loggers = trainer.logger_objects(self.run_dir)
            params = for_loggers(trainer.config, logged_hparams)  # the config and save_hyperparameters()'s
            if params is not None:
                for logger in self.loggers:
                    logger.log_hyperparams(params)

    def loader(self, dataset: Any, batches: Iterable, purpose: str, first_batch: int = 0) -> Any:
        seed = derive_seed(self.trainer.seed, purpose, self.epoch, self.data_rank)  # pipeline stages alike
        return self.data.loader(dataset, batches, purpose, seed, first_batch)

    def datasets(self) -> None:
        # The data hooks run under one seed on every rank; the per-rank streams go on after them.
        self.data = RunData(self.module, self.trainer)
        self.val_set = self.data.val_set
        if not self.data.evaluating:  # test / predict read no validation data
            check_validation_setup(self)

    def log(self, metrics: dict[str, float]) -> None:
        self.last_metrics.update(metrics)
        hidden = self.module_logs.hidden  # self.log(..., logger=False): for the hooks and monitors only
        written = {k: v for k, v in metrics.items() if k not in hidden} if hidden else metrics
        for logger in self.loggers:
            logger.log_metrics(written, self.step)

    def request_stop(self, reason: str) -> None:
        """End training at the end of the current step (for callbacks; see ``Callback``)."""
        self.callbacks.request_stop(reason)

    def stop_requested(self) -> bool:
        """A stop was asked for: by a callback, or by ``trainer.should_stop`` on this rank."""
        return self.stop_flag.requested or self.callbacks.stopping

    def stop_request(self) -> tuple[str, str] | None:
        """(who asked, why) of a callback's stop request, or None."""
        return self.callbacks.stop

    def ask_stop_at_next_logging_step(self, value: bool) -> None:
        """``trainer.should_stop = value`` (agreed by every rank at the next logging step)."""
        self.stop_flag.set(value, agreed_stop=self.callbacks.stopping)

    def teardown(self, clean: bool) -> None:
        self.module._log_collector = None  # self.log outside a run is an error
        self.module.__dict__.pop("_gradient_clipper", None)
        if self.checkpoints is not None:
            self.checkpoints.close(clean)
        for logger in self.loggers:
            logger.finalize()
        self.strategy.teardown(clean)

    # ----- training -----------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        trainer, module = self.trainer, self.module
        train_set = self.data.train_set()
        plan = self.data.plan(self.data_parallel_size)
        steps_per_epoch, limits, total_steps = plan_limits(self, plan)  # limit_train_batches, max_steps (step_limits.py)
        self.num_training_batches = training_batches(plan, steps_per_epoch)  # (trainer.num_training_batches)
        self.optimizer, schedulers = configure_optimizers(module)  # also: an optimizer= it was given and ignored
        self.lr_scheduling = LRScheduling(schedulers)
        if self.hooks.module_overrides("lr_scheduler_step"):  # the module steps each scheduler itself
            self.lr_scheduling.step_scheduler = module.lr_scheduler_step
        if module.automatic_optimization:  # self.clip_gradients in configure_gradient_clipping
            module.__dict__["_gradient_clipper"] = gradient_clipper(self)
        self.lr_scheduling.known_names = self.module_logs.known_names  # ReduceLROnPlateau on self.log names
        self.lr_scheduling.check_fit(self.val_set is not None, validates_during_training(trainer), self.rank)
        self.manual = setup_optimizers(self, schedulers)  # a ManualStep under automatic_optimization = False
        if trainer.checkpoint is not None and trainer.checkpoint.enabled:
            self.checkpoints = CheckpointManager(trainer.checkpoint, self.run_dir, self.strategy)
            self.checkpoints.setup()
        if self.rank == 0 and (short := plan.short_of_one_batch()):  # every rank would say it alike
            log.warning(short)
        log.info(
            "strategy %s, world size %d, global batch %s, %s, %s, run dir %s",
            self.strategy.name, distributed.world_size(), plan.describe_global_batch(), describe_epoch(plan, steps_per_epoch),
            limits.describe_total(), self.run_dir,
        )
        self.restore(plan)
        # trainer.auto_batch_size: trials pick the micro-batch (trainer/loop/batch_size_finder.py); it may change the plan
        plan, steps_per_epoch, limits, total_steps = find_batch_size(self, plan, steps_per_epoch, limits, total_steps)
        limits.note_schedules(self)
        # fp16: sync-free where the optimizer skips on a device flag (after the resume: the scaler's counts).
        self.fp16 = Fp16Steps(self.precision.scaler, self.strategy, self.optimizer, self.rank) \
            if self.precision.scaler is not None else None
        if self.summary is not None:
            count_local(self.summary, module)  # each rank's share (one gather, at the start only)
            if self.rank == 0:
                log.info("model summary:\n%s", self.summary.table())
        self.throughput = Throughput(self.device, distributed.world_size(), self.precision.compute_dtype != torch.float32)
        self.breakdown = WallClockBreakdown(trainer.profile["wall_clock_breakdown"], self.device)
        self.trace = TraceWindow(trainer.profile["trace_steps"], self.run_dir, self.rank, self.device)
        self.comms = CommsLog(trainer.profile["comms_steps"], self.run_dir, self.rank)
        if trainer.nonfinite_loss == "error":  # fp16: an inf loss is an overflow (skipped), a NaN one an error
            self.nonfinite = NonfiniteLossWatch(self.device, nan_only=self.precision.scaler is not None)
        self.train_step = self.manual.train_step if self.manual is not None else TrainStep(self)  # one step
        module.train()
        self.running_stage = "train"  # (Lightning's trainer.training: the whole fit but its evaluation passes)
        self.hooks.call("on_fit_start")
        run_sanity_check(self)  # trainer.num_sanity_val_steps: the training stream is left as it was
        self.hooks.call("on_train_start")
        progress = ProgressBar(total_steps, trainer.progress_bar if self.rank == 0 else False,
                               initial=limits.progress_position(self))
        progress.also_show = self.module_logs.prog_bar  # self.log(..., prog_bar=True) names, as they come
        progress.own_values = self.module_logs.shadowed  # the returned loss, where the user logs train/loss
        self.module_logs.begin("train")
        validated_at = saved_at = -1
        counts_check = FirstBatchCheck(manual=self.manual is not None)  # ranks' opt.step() counts (manual)
        observing = self.trace.steps is not None or self.comms.enabled  # a profiler or comms-log window is set
        try:
            while not limits.done(self) and not self.preempted and not self.callbacks.should_stop(self.step):
                # On resume mid-epoch: the epoch's remaining steps, the same samples as before.
                # Both are computed lazily, step by step (O(global batch) each, nothing per epoch).
                steps = plan.rank_steps(self.epoch, self.data_rank, self.epoch_step)
                self.start_epoch(trainer.accumulate_grad_batches)
                self.hooks.call("on_train_epoch_start")
                batches = iter(self.loader(
                    train_set, plan.rank_batches(self.epoch, self.data_rank, self.epoch_step), "train", self.batch_idx
                ))
                for step_plan in steps:
                    if limits.done(self) or self.epoch_step >= steps_per_epoch:
                        break
                    last = limits.before_batch(self)  # (also notes global_step before the batch)
                    log_now = (self.step + 1) % trainer.log_every_n_steps == 0 or last
                    if observing:
                        self.trace.before_step(self.step + 1)
                        self.comms.before_step(self.step + 1)
                    # interval="epoch" schedulers step right after the epoch's last optimizer step (Lightning's place)
                    self.ends_epoch = self.epoch_step + 1 == steps_per_epoch
                    metrics = self.train_step(step_plan, batches, log_now)
                    self.step_done()
                    stepped_from = limits.after_batch(self)  # global_step before this batch
                    if counts_check.pending:
                        counts_check.after_batch(self.global_step, self.step, logging_step=metrics is not None)
                    if observing:
                        self.comms.after_step(self.step)
                        self.trace.after_step(self.step)
                    if metrics is not None:
                        metrics["epoch"] = self.epoch
                        self.log(metrics)
                        self.lr_scheduling.on_logging_step(self.step, metrics)  # ReduceLROnPlateau on train/ metrics
                        log.info("step %s  %s", limits.describe(self), format_metrics(metrics))
                    if "on_train_step_end" in self.hooks.active:
                        self.hooks.call("on_train_step_end", self.step, metrics)
                    if metrics is not None:  # trainer.should_stop: agreed on logging steps only
                        self.stop_flag.agree(self.callbacks, self.global_step if self.manual is not None else None, self.step)
                    if progress.shown:
                        progress.update(metrics, limits.advance(self))
                    if trainer.val_every_n_steps and self.step % trainer.val_every_n_steps == 0:
                        progress.note(self.validate())
                        validated_at = self.step
                    if self.checkpoints is not None:
                        self.checkpoints.poll()
                        if self.checkpoints.due_after_step(self.global_step, stepped_from):
                            self.save_checkpoint()
                            saved_at = self.step
                        if self.checkpoints.stop_requested(self.step, logging_step=metrics is not None):
                            rank_zero_warn(log, "preemption signal: saving at step %d and stopping", self.step)
                            if saved_at != self.step:
                                self.save_checkpoint()
                                saved_at = self.step
                            self.preempted = True
                            break
                    if self.callbacks.should_stop(self.step):  # the same answer on every rank
                        break
                # An epoch cut short (max_steps mid-epoch, a stop) has no epoch end: the checkpoint
                # keeps its position, so a resumed or extended run goes on inside the epoch.
                if self.preempted or self.callbacks.stopping or not epoch_over(plan, self.epoch, self.epoch_step, steps_per_epoch):
                    break
                every_epochs = trainer.check_val_every_n_epoch
                if every_epochs and (self.epoch + 1) % every_epochs == 0 and validated_at != self.step:
                    self.validate()
                    validated_at = self.step
                with self.module_logs.epoch_end_hooks():  # (Lightning's order: the metric watchers last)
                    # The epoch's values so far, as Lightning's callback_metrics show them in these hooks.
                    self.last_metrics.update(self.module_logs.peek_epoch_metrics("train", self.strategy))
                    self.hooks.call_callbacks("on_train_epoch_end", watching=False)
                    call_module_hook(module, "on_train_epoch_end", self.epoch)  # or Lightning's on_train_epoch_end()
                if epoch_logged := self.module_logs.epoch_metrics("train", self.strategy):  # on_epoch values
                    self.log({**epoch_logged, "epoch": self.epoch})
                    progress.note(epoch_logged)
                self.lr_scheduling.on_epoch_metrics(self.epoch, epoch_logged)
                self.hooks.call_callbacks("on_train_epoch_end", watching=True)
                if self.epoch_step < steps_per_epoch:  # a stream that ended early (else: stepped with the last step)
                    self.lr_scheduling.after_epoch()
                self.epoch_done()
                if self.checkpoints is not None and self.checkpoints.due_after_epoch(self.epoch - 1):
                    self.save_checkpoint()
                    saved_at = self.step
        finally:
            progress.close()
            self.trace.close()
            self.comms.close()
        if self.module_logs.pending_epoch_values("train"):
            rank_zero_warn(log, "self.log(..., on_epoch=True) values of training epoch %d are not logged: the epoch did "
                           "not finish (max_steps, a stop or preemption), and epoch values are logged at epoch ends",
                           self.epoch)
        if self.preempted:
            return self.last_metrics
        if validated_at != self.step:
            self.validate()
        if self.checkpoints is not None and self.checkpoints.config.save_last and saved_at != self.step:
            self.save_checkpoint()
        self.hooks.call("on_train_end")
        self.hooks.call("on_fit_end")
        return self.last_metrics

    # ----- checkpoints ------------------------------------------------------------------------------------
    def settle_nonfinite(self, now: int | None = None) -> None:
        """The late non-finite loss check (one host sync): a NaN state is never validated or saved."""
        if self.nonfinite is not None:
            self.nonfinite.settle(self.rank, self.step if now is None else now)

    def save_checkpoint(self) -> None:
        self.settle_nonfinite()  # a late non-finite check is settled before any checkpoint commits
        self.checkpoints.save(self.checkpoint_states())

    def checkpoint_states(self) -> RunStates:
        """The parts of this run a checkpoint saves and restores, by name."""
        return RunStates(model=self.module, optimizer=self.optimizer, progress=self.progress, metrics=self.last_metrics,
                         scheduler=self.lr_scheduling, precision=getattr(self, "precision", None),
                         callbacks=self.callbacks, data=getattr(getattr(self, "data", None), "stream_plan", None),
                         seed=self.trainer.seed,
                         hparams_objects=self.hparams_archive.payload if self.hparams_archive is not None else None)

    def progress(self) -> dict[str, Any]:
        """Where training stands, as saved in a checkpoint."""
        trainer = self.trainer
        return {
            "step": self.step, "global_step": self.global_step, "epoch": self.epoch, "epoch_step": self.epoch_step, "seed": trainer.seed,
            "world_size": distributed.world_size(), "global_batch_size": trainer.global_batch_size,
            "config": trainer.config, "max_steps": trainer.max_steps, "schedule_steps": self.lr_scheduling.schedule_steps(),
            # rank 0: the lines of metrics.jsonl so far (a resume from here cuts the file back to them)
            "logged_rows": next((logger.lines_written() for logger in self.loggers if isinstance(logger, JSONLLogger)), None),
            # load_from_checkpoint reads them (redacted ones named; objects pickled in hparams.pt)
            "hparams": checkpoint_record(self.module.hparams, hparams_name(self.module)),
            **({"datamodule_hparams": checkpoint_record(datamodule.hparams, hparams_name(datamodule))}
               if (datamodule := trainer.datamodule) is not None and datamodule.hparams else {}),
        }

    def restore(self, plan: GlobalBatchPlan) -> None:
        """Resume from ``trainer.resume`` (after the optimizer and scheduler exist)."""
        restore_run(self, plan)

    # ----- validation -----------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        self.settle_nonfinite()
        return run_validation(self)

