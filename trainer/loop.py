"""The loop one rank runs: set-up, optimizer steps over global batches, logging (validation is in
trainer/validation.py, resuming in trainer/checkpoint/resume.py).

A non-logging step makes no host sync and no collective but the gradient ones (FSDP's gathers,
pipeline sends, ZeRO-1's broadcast included), the grad-norm all-reduce when clipping and the token
count all-reduce with ``loss_normalization=tokens`` (tests/test_hot_path.py counts them). Token
counts and the late non-finite check: trainer/step_accounting.py. fp16 keeps its overflow decision
on the device where the optimizer can skip on it (fused Adam/AdamW/SGD), else reads it (one host
sync: trainer/precision/fp16_step.py); it is all-reduced only where the ranks' gradients differ (not DDP). Logging steps reduce
the metrics (one all-reduce), settle the non-finite check (also before validation and saves) and
agree on preemption signals (also every ``checkpoint.signal_check_every_n_steps``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer import distributed
from trainer.callbacks import CallbackList
from trainer.callbacks.callback_list import call_hooks
from trainer.checkpoint import CheckpointError, CheckpointManager, load_weights
from trainer.checkpoint.resume import restore_run
from trainer.comms_log import OVERFLOW_KIND, TOKEN_COUNT_KIND, CommsLog, labelled
from trainer.data import GlobalBatchPlan, StepPlan, derive_seed, seed_everything
from trainer.hparams import checkpoint_record, for_loggers
from trainer.datamodule import setup_datamodule
from trainer.evaluation import run_evaluation
from trainer.launch import ClusterEnvironment
from trainer.loggers import Logger, build_loggers
from trainer.lr_scheduling import LRScheduling
from trainer.manual_optimization import setup_optimizers
from trainer.metrics import WeightedSums, format_metrics, split_step_output
from trainer.model_summary import count_local, summarize
from trainer.module_hooks import call_module_hook
from trainer.module_logging import LogCollector, merge_logged
from trainer.optimizers import configure_optimizers
from trainer.precision.fp16_step import Fp16Steps
from trainer.profiling import TraceWindow, WallClockBreakdown
from trainer.progress import ProgressBar
from trainer.rank_logging import configure_rank_logging, log_to_file, rank_zero_warn
from trainer.run_state import StopFlag
from trainer.run_limits import train_steps_per_epoch, val_interval_steps
from trainer.step_limits import StepLimits
from trainer.sanity_check import run_sanity_check
from trainer.speedups import apply_activation_checkpointing, compile_blocks
from trainer.step_accounting import NonfiniteLossWatch, TokenCount, counted
from trainer.sync_batchnorm import padding_micro_batch
from trainer.tensors import local_tensor, move_to_device
from trainer.throughput import FlopSum, Throughput, write_flops_by_module
from trainer.token_weights import token_weighted
from trainer.user_loader import RunData
from trainer.validation import check_validation_setup, run_validation
from trainer.weights_return import record_result
from trainer.weight_init import WeightInit, has_meta_tensors
from trainer.wrap_policy import select_units

if TYPE_CHECKING:
    from trainer.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)


class _Run:
    """State of one fit/validate on one rank."""

    def __init__(self, trainer: Trainer, module: TrainModule, env: ClusterEnvironment, own_log_handler: bool):
        self.trainer = trainer
        self.own_log_handler = own_log_handler
        self.module = module
        self.env = env
        self.strategy = trainer.strategy
        self.loggers: list[Logger] = []
        self.rank = env.rank
        self.step = 0  # global batches trained (the logged step axis, checkpoint names, the data position)
        self.optimizer_steps: int | None = None  # manual optimization: the module's opt.step() calls
        self.epoch = 0
        self.epoch_step = 0  # optimizer steps done in this epoch
        self.batch_idx = 0  # micro-batches run in this epoch, passed to training_step
        self.preempted = False
        self.checkpoints: CheckpointManager | None = None
        self.optimizer: Any = None  # a list of them under manual optimization with several
        self.manual: Any = None  # automatic_optimization = False: trainer/manual_optimization.py
        self.fp16: Fp16Steps | None = None  # fp16-mixed: the optimizer step's overflow handling
        self.lr_scheduling = LRScheduling()  # the schedulers and when they step
        self._counts_tokens = False  # training_step returns num_tokens: log tokens/s
        self._owned_steps = 0  # steps run by a strategy that owns the step (pipeline)
        self.nonfinite: NonfiniteLossWatch | None = None  # trainer.nonfinite_loss=error: settled late
        self.last_metrics: dict[str, float] = {}
        self.callbacks = CallbackList(trainer.callbacks, self)
        self.stop_flag = StopFlag()  # trainer.should_stop = True (trainer/run_state.py)
        self.total_steps: int | None = None  # trainer.estimated_stepping_batches, known in fit
        self.summary = None  # the model summary, counted before the strategy splits the model

    @property
    def global_step(self) -> int:  # optimizer steps: the batches, or the module's opt.step() calls (manual)
        return self.step if self.optimizer_steps is None else self.optimizer_steps

    # ----- set-up -----------------------------------------------------------------------------------
    def setup(self) -> None:
        trainer, module, strategy = self.trainer, self.module, self.strategy
        strategy.setup_environment(self.env, trainer.collective_timeout)
        self.device = strategy.device
        self.rank = distributed.rank()
        self.dp_size = strategy.gradient_average_size
        self.data_rank = strategy.data_parallel_rank  # which samples this rank loads
        # Under torchrun every rank built its own Trainer: rank 0's run directory wins.
        self.run_dir = trainer.run_dir = distributed.broadcast_object(trainer.run_dir)
        if self.rank == 0:
            os.makedirs(self.run_dir, exist_ok=True)
            if self.own_log_handler:
                log_to_file(os.path.join(self.run_dir, "train.log"))
        module._trainer = trainer
        trainer._run = self  # the run-state properties read this run (trainer/run_state.py)
        refused = "not supported under strategy=pipeline; return the metric from pipeline_loss" if strategy.owns_step else None
        self.module_logs = module._log_collector = LogCollector(self.device, refused)  # self.log's values
        with distributed.rank_zero_first(local=True) as first:
            if first:
                module.prepare_data()
                if trainer.datamodule is not None:
                    trainer.datamodule.prepare_data()
        setup_datamodule(trainer.datamodule, trainer.stage, trainer.seed)  # every rank, under one seed
        # Seeded right before the build so every rank builds the same weights (prepare_data ran
        # on some ranks only and may have drawn random numbers).
        seed_everything(trainer.seed)
        with strategy.init_context():
            module.configure_model()
        init = WeightInit(module, trainer.seed)
        if not has_meta_tensors(module):
            module.to(self.device)
            init.eager()
        self.precision = trainer.precision
        self.precision.convert_module(module)
        strategy.configure_precision(self.precision)
        if trainer.activation_checkpointing or trainer.compile:
            blocks = select_units(module, "auto", module.block_classes())
            if trainer.activation_checkpointing:
                apply_activation_checkpointing(module, blocks)
            if trainer.compile:
                compile_blocks(module, blocks)
        if trainer.sync_batchnorm:
            from trainer.sync_batchnorm import convert_sync_batchnorm, warn_if_nothing_to_sync

            warn_if_nothing_to_sync(module, self.dp_size)

            # After the build and on its device (CUDA batch norms become torch's nn.SyncBatchNorm),
            # before wrapping, so DDP / FSDP register the synchronised layers. The default group is
            # the data-parallel group of DDP and FSDP (hybrid included).
            convert_sync_batchnorm(module, process_group=None)
        self.datasets()  # before wrapping: resolves trainer.batch_size (a strategy may need it)
        if trainer.enable_model_summary:
            self.summary = summarize(module)
        self.wrapped = strategy.wrap(module, init)  # materialises a meta-device build, unit by unit
        # Different random streams per rank from here on (dropout; also each pipeline stage's own).
        # Loading draws from its own per-batch seeds, keyed by the data-parallel rank (self.loader).
        seed_everything(derive_seed(trainer.seed, "rank", self.rank))
        trainer.model = self.wrapped
        if trainer.init_from is not None:
            load_weights(trainer.init_from, module, part_of_model=strategy.owns_step)  # pipeline: this rank's stages
        if self.rank == 0:
            source = getattr(trainer, "ckpt_path", None) or trainer.resume  # (fit's ckpt_path= or trainer.resume)
            if source not in (None, "auto", "last", "best"):
                # Resumed into a new run directory: the W&B run of the checkpoint's run goes on.
                from trainer.loggers import adopt_run_id

                checkpoints = os.path.abspath(source)
                while os.path.basename(checkpoints) not in ("checkpoints", "") and not os.path.isfile(
                    os.path.join(checkpoints, "latest")
                ):
                    checkpoints = os.path.dirname(checkpoints)
                adopt_run_id(os.path.dirname(checkpoints), self.run_dir)
            self.loggers = build_loggers(trainer.loggers, self.run_dir)
            params = for_loggers(trainer.config, module.hparams)  # the config and save_hyperparameters()'s
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

    def teardown(self, clean: bool) -> None:
        self.module._log_collector = None  # self.log outside a run is an error
        if self.checkpoints is not None:
            self.checkpoints.close(clean)
        for logger in self.loggers:
            logger.finalize()
        self.strategy.teardown(clean)

    # ----- training -----------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        trainer, module = self.trainer, self.module
        train_set = self.data.train_set()
        plan = self.data.plan(self.dp_size)
        steps_per_epoch = train_steps_per_epoch(trainer, plan.steps_per_epoch)  # limit_train_batches
        trainer.val_every_n_steps = val_interval_steps(trainer, steps_per_epoch)  # a float val_check_interval
        # max_steps counts optimizer steps: under manual optimization not batches (trainer/step_limits.py)
        limits = StepLimits(trainer, steps_per_epoch, manual=not getattr(module, "automatic_optimization", True))
        self.total_steps = limits.estimated_stepping_batches(trainer)  # (a str: why it is unknown)
        total_steps = limits.progress_total()
        self.optimizer, schedulers = configure_optimizers(module)  # also: an optimizer= it was given and ignored
        self.lr_scheduling = LRScheduling(schedulers)
        self.lr_scheduling.known_names = self.module_logs.known_names  # ReduceLROnPlateau on self.log names
        self.lr_scheduling.check_fit(self.val_set is not None, trainer.val_every_n_steps, self.rank)
        self.manual = setup_optimizers(self, schedulers)  # a ManualStep under automatic_optimization = False
        if trainer.checkpoint is not None and trainer.checkpoint.enabled:
            self.checkpoints = CheckpointManager(trainer.checkpoint, self.run_dir, self.strategy)
            self.checkpoints.setup()
        if self.rank == 0 and (short := plan.short_of_one_batch()):  # every rank would say it alike
            log.warning(short)
        log.info(
            "strategy %s, world size %d, global batch %s, %d steps per epoch, %s, run dir %s",
            self.strategy.name, distributed.world_size(), plan.describe_global_batch(), steps_per_epoch,
            limits.describe_total(), self.run_dir,
        )
        self.restore(plan)
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
        self._tokens_since_log = TokenCount(self.device)  # reduced on logging steps
        if trainer.nonfinite_loss == "error":  # fp16: an inf loss is an overflow (skipped), a NaN one an error
            self.nonfinite = NonfiniteLossWatch(self.device, nan_only=self.precision.scaler is not None)
        module.train()
        module.on_fit_start()
        self.callbacks.on_fit_start(self)
        run_sanity_check(self)  # trainer.num_sanity_val_steps: the training stream is left as it was
        progress = ProgressBar(total_steps, trainer.progress_bar if self.rank == 0 else False,
                               initial=limits.progress_position(self))
        progress.also_show = self.module_logs.prog_bar  # self.log(..., prog_bar=True) names, as they come
        self.module_logs.begin("train")
        validated_at = saved_at = -1
        try:
            while not limits.done(self) and not self.preempted and not self.callbacks.should_stop(self.step):
                # On resume mid-epoch: the epoch's remaining steps, the same samples as before.
                # Both are computed lazily, step by step (O(global batch) each, nothing per epoch).
                steps = plan.rank_steps(self.epoch, self.data_rank, self.epoch_step)
                self.batch_idx = self.epoch_step * trainer.accumulate_grad_batches
                call_hooks(self, "on_train_epoch_start")
                batches = iter(self.loader(
                    train_set, plan.rank_batches(self.epoch, self.data_rank, self.epoch_step), "train", self.batch_idx
                ))
                for step_plan in steps:
                    if limits.done(self) or self.epoch_step >= steps_per_epoch:
                        break
                    last = limits.before_batch(self)  # (also notes global_step before the batch)
                    log_now = (self.step + 1) % trainer.log_every_n_steps == 0 or last
                    self.trace.before_step(self.step + 1)
                    self.comms.before_step(self.step + 1)
                    metrics = self._train_step(step_plan, batches, log_now)
                    self.step += 1
                    stepped_from = limits.after_batch(self)  # global_step before this batch
                    self.comms.after_step(self.step)
                    self.trace.after_step(self.step)
                    self.epoch_step += 1
                    if metrics is not None:
                        metrics["epoch"] = self.epoch
                        self.log(metrics)
                        self.lr_scheduling.on_logging_step(self.step, metrics)  # ReduceLROnPlateau on train/ metrics
                        log.info("step %s  %s", limits.describe(self), format_metrics(metrics))
                    module.on_train_step_end(self.step, metrics)
                    self.callbacks.on_train_step_end(self, self.step, metrics)
                    self.stop_flag.agree(self, logging_step=metrics is not None)  # trainer.should_stop
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
                if self.preempted or self.callbacks.stopping or self.epoch_step < steps_per_epoch:
                    break
                every_epochs = trainer.check_val_every_n_epoch
                if every_epochs and (self.epoch + 1) % every_epochs == 0 and validated_at != self.step:
                    self.validate()
                    validated_at = self.step
                with self.module_logs.epoch_end_hooks():
                    call_module_hook(module, "on_train_epoch_end", self.epoch)  # or Lightning's on_train_epoch_end()
                if epoch_logged := self.module_logs.epoch_metrics("train", self.strategy):  # on_epoch values
                    self.log({**epoch_logged, "epoch": self.epoch})
                    progress.note(epoch_logged)
                self.lr_scheduling.on_epoch_metrics(self.epoch, epoch_logged)
                self.callbacks.on_train_epoch_end(self, self.epoch)
                if self.epoch_step == steps_per_epoch:  # a finished epoch (not one that max_steps cut short)
                    self.lr_scheduling.after_epoch()
                self.epoch += 1
                self.epoch_step = 0
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
        module.on_fit_end()
        self.callbacks.on_fit_end(self)
        return self.last_metrics

    # ----- checkpoints ------------------------------------------------------------------------------------
    def settle_nonfinite(self, now: int | None = None) -> None:
        """The late non-finite loss check (one host sync): a NaN state is never validated or saved."""
        if self.nonfinite is not None:
            self.nonfinite.settle(self.rank, self.step if now is None else now)

    def save_checkpoint(self) -> None:
        self.settle_nonfinite()  # a late non-finite check is settled before any checkpoint commits
        self.checkpoints.save(self)

    def progress(self) -> dict[str, Any]:
        """Where training stands, as saved in a checkpoint."""
        trainer = self.trainer
        return {
            "step": self.step, "global_step": self.global_step, "epoch": self.epoch, "epoch_step": self.epoch_step, "seed": trainer.seed,
            "world_size": distributed.world_size(), "global_batch_size": trainer.global_batch_size,
            "config": trainer.config, "max_steps": trainer.max_steps, "schedule_steps": self.lr_scheduling.schedule_steps(),
            "hparams": checkpoint_record(self.module.hparams),  # load_from_checkpoint reads them (redacted ones named)
        }

    def restore(self, plan: GlobalBatchPlan) -> None:
        """Resume from ``trainer.resume`` (after the optimizer and scheduler exist)."""
        restore_run(self, plan)

    def _train_step(self, plan: StepPlan, batches: Iterator[Any], log_now: bool) -> dict[str, float] | None:
        if self.manual is not None:  # the module steps its optimizers in training_step
            return self.manual.train_step(plan, batches, log_now)
        trainer, strategy, module, precision = self.trainer, self.strategy, self.module, self.precision
        timer = self.breakdown
        by_tokens = trainer.loss_normalization == "tokens"
        sums = WeightedSums(self.device) if log_now else None
        self.module_logs.begin_step(log_now)
        local_tokens = TokenCount(self.device) if by_tokens else None
        nonfinite = self.nonfinite
        last = len(plan.micro_batches) - 1
        timer.step_started()
        micro_batches = plan.micro_batches
        if strategy.owns_step:
            # Pipeline parallel: the strategy runs each micro-batch's forward and backward itself.
            self._strategy_micro_batches(plan, batches, sums, local_tokens)
            micro_batches = ()
        for index, micro_batch in enumerate(micro_batches):
            with timer.phase("data"):
                batch = precision.convert_input(move_to_device(next(batches), self.device, non_blocking=trainer.pin_memory))
            # FLOPs of one micro-batch's forward + backward, counted once (the first one).
            counting = self.throughput.flops_per_step is None and index == 0
            counter = FlopCounterMode(display=False) if counting else contextlib.nullcontext()
            padding = padding_micro_batch() if micro_batch.num_real == 0 else contextlib.nullcontext()  # no BN stats
            batch_idx = self.batch_idx
            call_hooks(self, "on_train_batch_start", batch, batch_idx)
            with strategy.sync_context(self.wrapped, sync=index == last), counter, padding:
                with timer.phase("forward"):  # the step's forward and its bookkeeping
                    with precision.autocast(self.device), self.module_logs.micro_batch(micro_batch.num_real):
                        output = self.wrapped(batch, self.batch_idx)
                    loss, metrics = split_step_output(output, "training_step")
                    self.batch_idx += 1
                    if loss is None:
                        raise ValueError("training_step returned no loss; return a tensor or a dict with 'loss'")
                    if nonfinite is not None:
                        nonfinite.observe(loss)  # tensor ops; read when settled
                    num_tokens = metrics.pop("num_tokens", None)  # a count, not a metric to average
                    if num_tokens is not None:  # a Python int stays one: no copy to the device per micro-batch
                        num_tokens = counted(num_tokens, micro_batch.num_real > 0)
                        self._counts_tokens = True  # the same on every rank (same code), so the reduce below matches
                        self._tokens_since_log.add(num_tokens)
                    if by_tokens:
                        if num_tokens is None:
                            raise ValueError("loss_normalization='tokens' needs training_step to return 'num_tokens'")
                        weight = num_tokens
                    else:
                        weight = micro_batch.num_real
                    if sums is not None:
                        sums.add({"loss": loss, **metrics}, weight)
                with timer.phase("backward"):
                    if by_tokens:
                        local_tokens.add(weight)
                        # Backward the token sum; gradients are divided by the global token count below.
                        precision.scale_loss(token_weighted(loss, weight)).backward()  # counts not rounded
                    else:
                        # Mean over the micro-batch x its share of the global batch x the ranks the sync
                        # averages over = this micro-batch's part of the global-batch mean.
                        precision.scale_loss(loss * (weight * self.dp_size / plan.global_count)).backward()
            call_hooks(self, "on_train_batch_end", output, batch, batch_idx)
            if counting:
                self.throughput.set_flops_per_micro_batch(counter.get_total_flops(), len(plan.micro_batches))
                if self.rank == 0:
                    write_flops_by_module(counter, os.path.join(self.run_dir, "flops.txt"))
        stepped, found_inf = True, None
        if nonfinite is not None:
            nonfinite.end_step(self.step + 1, self.epoch)
        with timer.phase("collectives"):
            # The local gradients (to_local per parameter), built only when something scales them.
            grads = ([local_tensor(p.grad) for p in module.parameters() if p.grad is not None]
                     if by_tokens or precision.scaler is not None else [])
            if by_tokens:
                with labelled(TOKEN_COUNT_KIND):
                    global_tokens = strategy.all_reduce_sum(local_tokens.total())
                torch._foreach_mul_(grads, (self.dp_size / global_tokens.clamp_min(1)).to(torch.float32))
            if precision.scaler is not None:
                # Every rank takes the same decision: an overflow on any rank skips the step everywhere.
                # Where the gradients are already reduced to the same values on every rank (DDP's
                # all-reduce, ZeRO-1 included), each rank's flag is computed from identical tensors by
                # the same ops, so it is identical too: agreeing on it would be a collective for nothing.
                agree = None if strategy.gradients_replicated else strategy.all_reduce_max
                with labelled(OVERFLOW_KIND):
                    found_inf = precision.scaler.unscale_found_inf(grads, agree)
                stepped = self.fp16.decide(found_inf)  # sync-free: True, the kernel skips on found_inf
        grad_norm = None
        with timer.phase("optimizer"):
            if stepped:
                if trainer.gradient_clip_val is not None:
                    grad_norm = strategy.clip_grad_norm(module, trainer.gradient_clip_val)
                elif log_now:  # reported on logging steps even without clipping (a reduction under FSDP)
                    grad_norm = strategy.grad_norm(module)
                module.on_before_optimizer_step(self.optimizer)
                if found_inf is None:
                    strategy.optimizer_step(self.optimizer)
                else:
                    self.fp16.step(self.optimizer, found_inf)
                self.lr_scheduling.after_optimizer_step()  # sync-free fp16: a skipped step advances it too
            else:
                log.info("step %d: gradient overflow, skipped (loss scale now %g)", self.step + 1, precision.scaler.scale)
            self.optimizer.zero_grad(set_to_none=True)
        timer.step_finished()
        self.throughput.step(plan.global_count)
        logged = self.module_logs.end_step(strategy)  # the step's self.log values (reduced on logging steps)
        if sums is None:
            return None
        self.settle_nonfinite(self.step + 1)
        metrics = sums.reduce("train/", strategy)
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/lr"] = float(self.optimizer.param_groups[0]["lr"])
        if precision.scaler is not None:
            self.fp16.on_logging_step(self.step + 1, metrics)
        tokens = float(strategy.all_reduce_sum(self._tokens_since_log.total())) if self._counts_tokens else None
        self._tokens_since_log.reset()
        metrics.update(self.throughput.metrics(tokens))
        metrics.update(timer.metrics())
        return merge_logged(metrics, logged, "training")

    def _strategy_micro_batches(self, plan: StepPlan, batches: Iterator[Any], sums: WeightedSums | None,
                                local_tokens: TokenCount | None) -> None:
        """``_train_step``'s micro-batches when the strategy owns the step (``strategy.owns_step``);
        adds to ``local_tokens`` (tokens normalisation) and the non-finite loss watch."""
        last = len(plan.micro_batches) - 1
        for index, micro_batch in enumerate(plan.micro_batches):
            with self.breakdown.phase("data"):
                batch = self.precision.convert_input(
                    move_to_device(next(batches), self.device, non_blocking=self.trainer.pin_memory)
                )
            # FLOPs counted once, on the first logging step after the first step (which also infers
            # the stages' shapes); the stages differ, so the job's count is the sum over ranks (a
            # collective and a host read: on a logging step only).
            counting = self.throughput.flops_per_step is None and index == 0 and self._owned_steps >= 1 and sums is not None
            counter = FlopSum() if counting else contextlib.nullcontext()
            call_hooks(self, "on_train_batch_start", batch, self.batch_idx)
            with self.breakdown.phase("forward"), counter:
                tokens, losses = self.strategy.run_step(batch, micro_batch.num_real, self.dp_size / plan.global_count,
                                                     index == last, sums, self.precision, local_tokens is not None)
            if counting:
                flops = torch.tensor(float(counter.get_total_flops()), dtype=torch.float64, device=self.device)
                self.throughput.set_flops_per_step(float(self.strategy.all_reduce_sum(flops)) * len(plan.micro_batches))
            if tokens is not None:  # (the same on every rank: the strategy agrees on it)
                self._counts_tokens = True
                self._tokens_since_log.add(tokens)
                if local_tokens is not None:
                    local_tokens.add(tokens)
            if self.nonfinite is not None:
                for loss in losses:
                    self.nonfinite.observe(loss)
            call_hooks(self, "on_train_batch_end", None, batch, self.batch_idx)  # the strategy ran the steps
            self.batch_idx += 1
        if sums is not None:
            self.strategy.complete_metrics(sums)
        self._owned_steps += 1

    # ----- validation -----------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        self.settle_nonfinite()
        return run_validation(self)


def run_on_rank(trainer: Trainer, module: TrainModule, mode: str, env: ClusterEnvironment) -> dict[str, float] | None:
    """Fit or validate on this rank; rank 0 returns the last logged metrics."""
    # Hydra's process has root handlers (console + train.log); workers we spawned or torchrun
    # ranks that did not run Hydra get their own stderr handler.
    own_log_handler = not logging.getLogger().handlers
    configure_rank_logging(env.rank, own_handler=own_log_handler)
    run = _Run(trainer, module, env, own_log_handler)
    trainer._run = run  # for callbacks: trainer.callbacks.run_of(trainer)
    clean = False
    try:
        run.setup()
        results = run.fit() if mode == "fit" else run_evaluation(run, mode)  # validate / test / predict
        record_result(run, mode)  # trainer.global_step ...; the weights for the caller of a spawned fit
        clean = True
    except BaseException as error:
        if isinstance(error, CheckpointError):  # it names the file; a traceback would say nothing more
            log.error("rank %d failed: %s", env.rank, error)
        elif env.launcher != "spawned":  # spawned: the launcher shows the first failure once (launch.spawn)
            log.exception("rank %d failed", env.rank)
        raise
    finally:
        trainer._run = None
        run.teardown(clean)
    return results if run.rank == 0 else None
