"""The loop one rank runs, in the order of ``TrainModule``'s pseudocode (trainer/api/module.py): the
parts come from ``build_run`` / ``build_fit``; ``fit`` is the loop; what follows each step is
``after_step``, what ends an epoch ``end_epoch``, what ends training ``end_fit``. One step:
trainer/loop/train_step.py (manual optimization: manual_step.py); validation: validation.py.

Names: ``module`` is the user's TrainModule, ``wrapped`` what ``strategy.wrap(module)`` returned (what a
training step calls; Lightning's public ``trainer.model``), ``data_parallel_size`` the ranks that load
different samples (``strategy.data_parallel_size()``, by which the gradient sync averages).

A non-logging step makes no host sync and no collective but the gradient ones (FSDP's gathers,
pipeline sends, ZeRO-1's broadcast included), the grad-norm all-reduce when clipping and the token
count all-reduce with ``loss_normalization=tokens`` (tests/multiprocess/observe/test_hot_path.py counts
them). Logging steps reduce the metrics (one all-reduce), settle the late non-finite check
(trainer/loop/step_accounting.py; also before validation and saves) and agree on preemption signals
(also every ``checkpoint.signal_check_every_n_steps``).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from trainer.api.batch_settings import BatchSettings
from trainer.api.hparams_archive import hparams_name
from trainer.api.hparams_display import checkpoint_record
from trainer.api.hook_table import MODULE
from trainer.api.run_view import RunView
from trainer.checkpoint.run_states import RunStates
from trainer.loggers import JSONLLogger
from trainer.loop.counters import RunCounters
from trainer.loop.data_reload import DataReload
from trainer.loop.logged_rows import write_eval_step_row, write_row
from trainer.loop.optimizer_step import EpochSkipped
from trainer.loop.run_parts import RunParts
from trainer.loop.sanity_check import run_sanity_check
from trainer.loop.step_counts import FirstBatchCheck
from trainer.loop.step_limits import FitPlan
from trainer.loop.stop_flag import StopFlag
from trainer.loop.stream_limits import epoch_over, training_batches
from trainer.loop.validation import run_validation
from trainer.observe.progress import ProgressBar
from trainer.runtime import distributed
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.metric_sums import format_metrics
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.seeding import derive_seed

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)


class RankRun(RunParts, RunCounters):
    """One call (fit, validate, test or predict) on one rank: the built parts (``RunParts``, read-only)
    and the run's state, each piece with one writer: the counters (``RunCounters``' methods), the
    metrics (``log``), the stage (``stage`` / ``enter_stage``), the batch and the fit's plan
    (``replan``), the validation batch counts (``count_val_batches``), stop requests (``StopFlag``)."""

    def __init__(self, trainer: Trainer, module: TrainModule, env: ClusterEnvironment, own_log_handler: bool):
        self.install(trainer=trainer, module=module, env=env, strategy=trainer.strategy, own_log_handler=own_log_handler)
        RunCounters.__init__(self)  # step, epoch, epoch_step, batch_idx, global_step: changed there only
        self.last_metrics: dict[str, float] = {}
        self.view = RunView(self)  # what callbacks, the Trainer's properties and tools read
        self.stop_flag = StopFlag()  # trainer.should_stop = True (trainer/api/run_state.py)
        self.batch: BatchSettings | None = None  # the resolved batch (replan)
        self.fit_plan: FitPlan | None = None  # fit's plan (replan)
        self.sanity_checking = False  # the sanity validation is running (trainer.sanity_checking)
        #: what runs now: "train", "sanity_check", "validate", "test", "predict" (trainer.state.stage); None between
        self.running_stage: str | None = None
        self.ends_epoch = False  # the step being trained is the epoch's last
        self.num_val_batches: list[int] = []  # this rank's batches of the current / last validation pass
        self.num_eval_batches: dict[str, list[int]] = {}  # test / predict: this rank's batches per loader
        self.eval_steps_logged: dict[tuple[str, int | None], int] = {}  # per stage and loader: the last batch's index
        self.eval_step_values: dict[str, float] = {}  # the last evaluation batch rows' values (logged_metrics)
        self.preempted = False
        self.data_reload: DataReload | None = None  # fit's reload_dataloaders_every_n_epochs

    # ----- the state's writers ------------------------------------------------------------------------
    def replan(self, batch: BatchSettings, fit_plan: FitPlan | None = None) -> None:
        """The run's batch settings (the data's, then the batch-size finder's choice) and fit's plan."""
        self.batch, self.fit_plan = batch, fit_plan

    @contextmanager
    def stage(self, name: str, sanity: bool | None = None) -> Iterator[None]:
        """Run ``name`` ("validate", "sanity_check" ...) inside the current stage, then return to it."""
        before = self.running_stage, self.sanity_checking
        self.running_stage = name
        if sanity is not None:
            self.sanity_checking = sanity
        try:
            yield
        finally:
            self.running_stage, self.sanity_checking = before

    def enter_stage(self, name: str) -> None:
        """The stage this call runs (fit's "train", validate / test / predict's own)."""
        self.running_stage = name

    def count_val_batches(self, counts: list[int | float]) -> None:
        """This rank's batches of the current validation pass (``trainer.num_val_batches``)."""
        self.num_val_batches = counts

    def log(self, metrics: dict[str, float]) -> None:
        """Record ``metrics`` (the callbacks' view) and write them with rank 0's loggers at this step
        (what each logger gets: ``logged_rows.py``)."""
        write_row(self, metrics)

    def log_eval_step(self, metrics: dict[str, float], step: int) -> None:
        """Write an evaluation batch's ``on_step`` values at ``step``, its index among its loader's
        batches in the stage (Lightning's axis for them); ``callback_metrics`` keeps the pass's
        aggregates, not these."""
        write_eval_step_row(self, metrics, step)

    # ----- what the view and the callbacks read --------------------------------------------------------
    @property
    def val_set(self) -> Any:
        """The validation set (None: the run does not validate); read again under
        ``reload_dataloaders_every_n_epochs`` (trainer/loop/data_reload.py)."""
        return self.data.val_set

    @property
    def validates(self) -> bool:
        """Whether the run has validation data (or will read it at its first validation pass)."""
        return self.data.val_set is not None or self.data.val_pending

    @property
    def total_steps(self) -> int | str | None:
        """``trainer.estimated_stepping_batches``: known once fit's plan is (None before)."""
        return self.fit_plan.total_steps if self.fit_plan is not None else None

    @property
    def num_training_batches(self) -> int | float:
        """This rank's micro-batches per epoch (Lightning's count; 0 before fit's plan)."""
        plan = self.fit_plan
        return training_batches(plan.plan, plan.steps_per_epoch) if plan is not None else 0

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

    def loader(self, dataset: Any, batches: Iterable, purpose: str, first_batch: int = 0) -> Any:
        """The loader of ``batches`` of ``dataset``, its workers seeded per epoch and data-parallel rank."""
        seed = derive_seed(self.trainer.seed, purpose, self.epoch, self.data_rank)  # pipeline stages alike
        return self.data.loader(dataset, batches, purpose, seed, first_batch)

    # ----- training -----------------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        """Train until a limit, a stop or preemption; returns the last logged metrics."""
        limits, hooks = self.fit_plan.limits, self.hooks
        self.data_reload = DataReload(self, self.data.read_for_sanity)
        # (the module's and its submodules' modes stay as the user left them, as in Lightning: a frozen
        # submodule in eval mode trains in eval mode; evaluation passes put every mode back: eval_modes.py)
        self.enter_stage("train")  # (Lightning's trainer.training: the whole fit but its evaluation passes)
        hooks.call("on_fit_start")
        run_sanity_check(self)  # trainer.num_sanity_val_steps: the training stream is left as it was
        if self.fit_plan.steps_per_epoch == 0:  # limit_train_batches=0 (as Lightning: no training, no validation)
            log.info("trainer.limit_train_batches=0: no training")
            hooks.call("on_fit_end")
            return self.last_metrics
        hooks.call("on_train_start")
        self.progress = ProgressBar(limits.progress_total(), self.trainer.progress_bar if self.rank == 0 else False,
                                    initial=limits.progress_position(self))
        self.progress.also_show = self.module_logs.prog_bar  # self.log(..., prog_bar=True) names, as they come
        self.progress.own_values = self.module_logs.shadowed  # the returned loss, where the user logs train/loss
        self.module_logs.begin("train")
        self.validated_at = self.saved_at = -1
        self.counts_check = FirstBatchCheck(manual=self.manual is not None)  # ranks' opt.step() counts (manual)
        self.observing = self.trace.steps is not None or self.comms.enabled  # a profiler or comms-log window is set
        try:
            while not limits.done(self) and not self.preempted and \
                    not self.callbacks.should_stop(self.step, self.min_run_done):
                # On resume mid-epoch: the epoch's remaining steps, the same samples as before.
                # Both are computed lazily, step by step (O(global batch) each, nothing per epoch).
                self.data_reload.before_epoch(self)  # reload_dataloaders_every_n_epochs
                plan, train_set = self.fit_plan.plan, self.data.train_set()
                steps = plan.rank_steps(self.epoch, self.data_rank, self.epoch_step)
                self.start_epoch(self.batch.accumulate_grad_batches)
                hooks.call("on_train_epoch_start")
                batches = iter(self.loader(
                    train_set, plan.rank_batches(self.epoch, self.data_rank, self.epoch_step), "train", self.batch_idx))
                skipped = self.train_epoch(steps, batches)
                # A stop (EarlyStopping, should_stop, a Timer) ends the epoch as Lightning does: its hooks,
                # its epoch values, the next epoch's position in the checkpoint. One cut short by max_steps
                # or preemption has no epoch end: a resumed or extended run goes on inside the epoch.
                stopped = self.callbacks.stopping and self.min_run_done()
                if self.preempted or not (skipped or stopped or epoch_over(
                        plan, self.epoch, self.epoch_step, self.fit_plan.steps_per_epoch)):
                    break
                # (a skipped epoch's rest validates nothing, nor does an epoch whose stream gave no batch)
                self.end_epoch(validate=not skipped and self.epoch_step > 0, stopped=stopped)
        finally:
            self.progress.close()
            self.trace.close()
            self.comms.close()
        return self.end_fit()

    def train_epoch(self, steps: Iterable[Any], batches: Iterator[Any]) -> bool:
        """The epoch's steps, until its end, a limit, a stop or preemption. Returns whether the module's
        ``on_train_batch_start`` returned -1 (on any rank): that global batch is not trained and the
        rest of the epoch is skipped (Lightning's meaning, the same on every rank)."""
        state, limits = self.__dict__, self.fit_plan.limits
        for step_plan in steps:
            last = limits.before_batch(self)  # None: done (also notes global_step before the batch)
            if last is None or self.epoch_step >= self.fit_plan.steps_per_epoch:
                break
            log_now = (self.step + 1) % self.trainer.log_every_n_steps == 0 or last
            if self.observing:
                self.trace.before_step(self.step + 1)
                self.comms.before_step(self.step + 1)
            # interval="epoch" schedulers step right after the epoch's last optimizer step (Lightning's
            # place); written past the parts' guard (RunParts.__setattr__), a call per step it need not be
            state["ends_epoch"] = self.epoch_step + 1 == self.fit_plan.steps_per_epoch
            try:
                metrics = self.train_step(step_plan, batches, log_now)
            except EpochSkipped:
                self.module_logs.drop_step()  # what the step's micro-batches logged before the -1
                if self.nonfinite is not None:
                    self.nonfinite.drop_step()
                return True
            self.step_done()
            if self.after_step(metrics):  # log, hooks, stop, validation, checkpoint, preemption
                break
        return False

    def after_step(self, metrics: dict[str, float] | None) -> bool:
        """Everything that follows a trained step, in order: the limits and profiler windows, logging,
        the step hook, the stop agreement, the progress bar, validation, checkpointing and preemption.
        Returns whether training stops here (preemption, or a stop every rank agreed on)."""
        stepped_from = self.fit_plan.limits.after_batch(self)  # global_step before this batch
        if self.counts_check.pending:
            self.counts_check.after_batch(self.global_step, self.step, logging_step=metrics is not None)
        if self.observing:
            self.comms.after_step(self.step)
            self.trace.after_step(self.step)
        if metrics is not None:
            metrics["epoch"] = self.epoch
            self.log(metrics)
            self.lr_scheduling.on_logging_step(self.step, metrics)  # ReduceLROnPlateau on train/ metrics
            log.info("step %s  %s", self.fit_plan.limits.describe(self), format_metrics(metrics))
        if "on_train_step_end" in self.hooks.active:
            self.hooks.call("on_train_step_end", self.step, metrics)
        if metrics is not None:  # trainer.should_stop: agreed on logging steps only
            self.stop_flag.agree(self.callbacks, self.global_step if self.manual is not None else None, self.step)
        if self.progress.shown:
            self.progress.update(metrics, self.fit_plan.limits.advance(self))
        if self.fit_plan.val_every_n_steps and self.fit_plan.val_schedule.after_step(self.step, self.epoch,
                                                                                      self.epoch_step):
            self.progress.note(self.validate())
        if self.checkpoints is not None:
            self.checkpoints.poll()
            if self.checkpoints.due_after_step(self.global_step, stepped_from):
                self.save_checkpoint()
            if self.checkpoints.stop_requested(self.step, logging_step=metrics is not None):
                rank_zero_warn(log, "preemption signal: saving at step %d and stopping", self.step)
                if self.saved_at != self.step:
                    self.save_checkpoint()
                self.preempted = True
                return True
        return self.callbacks.should_stop(self.step, self.min_run_done)  # the same answer on every rank

    def min_run_done(self) -> bool:
        """Whether a stop may end training now: ``min_epochs`` epochs finished and ``global_step`` at
        ``min_steps`` (Lightning's; the same on every rank)."""
        trainer = self.trainer
        return self.epoch >= (trainer.min_epochs or 0) and self.global_step >= (trainer.min_steps or 0)

    def end_epoch(self, validate: bool = True, stopped: bool = False) -> None:
        """A finished epoch: validation where the schedule puts one (``validate``; trainer/loop/val_schedule.py),
        the epoch-end hooks and epoch values (Lightning's order: the metric watchers last), epoch
        schedulers, the epoch checkpoint."""
        if validate and self.fit_plan.val_schedule.at_epoch_end(self.epoch, stopped) and self.validated_at != self.step:
            self.validate()
        with self.module_logs.epoch_end_hooks():
            # The epoch's values so far, as Lightning's callback_metrics show them in these hooks.
            self.last_metrics.update(self.module_logs.peek_epoch_metrics("train", self.strategy))
            self.hooks.call_callbacks("on_train_epoch_end", watching=False)
            self.hooks.call_receiver("on_train_epoch_end", MODULE, self.epoch)  # or Lightning's on_train_epoch_end()
        if epoch_logged := self.module_logs.epoch_metrics("train", self.strategy):  # on_epoch values
            self.log({**epoch_logged, "epoch": self.epoch})
            self.progress.note(epoch_logged)
        self.lr_scheduling.on_epoch_metrics(self.epoch, epoch_logged)
        self.hooks.call_callbacks("on_train_epoch_end", watching=True)
        if self.epoch_step < self.fit_plan.steps_per_epoch:  # a stream that ended early (else: with the last step)
            self.lr_scheduling.after_epoch()
        self.epoch_done()
        if self.checkpoints is not None and self.checkpoints.due_after_epoch(self.epoch - 1):
            self.save_checkpoint()

    def end_fit(self) -> dict[str, float]:
        """After the loop: the last validation and ``save_last`` checkpoint, the end hooks (not after
        preemption: the run ends where it saved)."""
        if self.module_logs.pending_epoch_values("train"):
            rank_zero_warn(log, "self.log(..., on_epoch=True) values of training epoch %d are not logged: the epoch did "
                           "not finish (max_steps or preemption), and epoch values are logged at epoch ends",
                           self.epoch)
        if self.preempted:
            return self.last_metrics
        if self.validated_at != self.step and getattr(self.trainer, "validates_at_fit_end", True):
            self.validate()  # (Lightning's Trainer does not: trainer/lightning/trainer/trainer.py)
        if self.checkpoints is not None and self.checkpoints.config.save_last and self.saved_at != self.step:
            self.save_checkpoint()
        self.hooks.call("on_train_end")
        self.hooks.call("on_fit_end")
        return self.last_metrics

    # ----- validation and checkpoints ------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """A validation pass at the current step (the late non-finite check settled first)."""
        self.settle_nonfinite()
        self.validated_at = self.step
        return run_validation(self)

    def settle_nonfinite(self, now: int | None = None) -> None:
        """The late non-finite loss check (one host sync): a NaN state is never validated or saved."""
        if self.nonfinite is not None:
            self.nonfinite.settle(self.rank, self.step if now is None else now)

    def save_checkpoint(self) -> None:
        """Save a checkpoint of this step (the late non-finite check settled first)."""
        self.settle_nonfinite()  # a late non-finite check is settled before any checkpoint commits
        self.checkpoints.save(self.checkpoint_states())
        self.saved_at = self.step

    def save_checkpoint_file(self, path: Any, weights_only: bool = False) -> str:
        """The run's state as one checkpoint file (``trainer.save_checkpoint``; a collective)."""
        from trainer.loop.save_file import save_checkpoint_file

        return save_checkpoint_file(self, path, weights_only)

    def checkpoint_states(self) -> RunStates:
        """The parts of this run a checkpoint saves and restores, by name."""
        return RunStates(model=self.module, optimizer=self.optimizer, progress=self.checkpoint_progress,
                         metrics=self.last_metrics, scheduler=self.lr_scheduling, precision=self.precision,
                         callbacks=self.callbacks, data=self.data.stream_plan, seed=self.trainer.seed,
                         hparams_objects=self.hparams_archive.payload if self.hparams_archive is not None else None)

    def checkpoint_progress(self) -> dict[str, Any]:
        """Where training stands, as saved in a checkpoint."""
        trainer = self.trainer
        return {
            # (a save in on_train_batch_end, after the batch's optimizer step: that batch is trained)
            "step": self.step + self._stepped, "global_step": self.global_step, "epoch": self.epoch,
            "epoch_step": self.epoch_step + self._stepped,
            "seed": trainer.seed, "world_size": distributed.world_size(), "global_batch_size": self.batch.global_batch_size,
            "config": trainer.config, "max_steps": trainer.max_steps, "schedule_steps": self.lr_scheduling.schedule_steps(),
            # rank 0: the lines of metrics.jsonl so far (a resume from here cuts the file back to them)
            "logged_rows": next((logger.lines_written() for logger in self.loggers if isinstance(logger, JSONLLogger)), None),
            # load_from_checkpoint reads them (redacted ones named; objects pickled in hparams.pt)
            "hparams": checkpoint_record(self.module.hparams, hparams_name(self.module)),
            **({"datamodule_hparams": checkpoint_record(datamodule.hparams, hparams_name(datamodule))}
               if (datamodule := trainer.datamodule) is not None and datamodule.hparams else {}),
        }

    def teardown(self, clean: bool) -> None:
        """Close what the run opened (checkpoint writers, loggers, the strategy's groups)."""
        self.module._log_collector = None  # self.log outside a run is an error
        self.module.__dict__.pop("_gradient_clipper", None)
        if self.checkpoints is not None:
            self.checkpoints.close(clean)
        for logger in self.loggers:
            logger.finalize("success" if clean else "failed")  # Lightning's status argument
        self.strategy.teardown(clean)
