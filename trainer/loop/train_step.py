"""One optimizer step under automatic optimization, in Lightning's order (trainer/api/module.py's pseudocode):

1. the micro-batches (`TrainStep.module_step`; per micro-batch: the batch transfer hooks,
   ``on_train_batch_start``, ``training_step``, on the first one ``on_before_zero_grad`` and
   ``optimizer_zero_grad``, ``on_before_backward``, ``backward``, ``on_after_backward``; the last one
   runs inside the optimizer closure that ``optimizer_step`` hands to ``optimizer.step``); or where the
   strategy owns the step (pipeline parallel), each micro-batch handed to its ``run_step``:
   trainer/loop/pipeline_micro_batches.py;
2. gradient normalisation and fp16 unscaling (`TrainStep.prepare_gradients`; the loss weights:
   trainer/loop/loss_normalization.py, the overflow decision: trainer/precision/fp16_step.py);
3. ``on_before_optimizer_step``, clipping (``configure_gradient_clipping``), the optimizer step and the
   schedule (`TrainStep.before_step`, `TrainStep.step_optimizer`); then the last
   micro-batch's ``on_train_batch_end``;
4. the metrics, on logging steps only (`TrainStep.metrics`: the one reduction and the host reads).

A non-logging step makes no host sync and no collective but the gradient ones (see trainer/loop/rank_run.py).
Manual optimization runs trainer/loop/manual_step.py's step instead.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer.runtime.comms_log import OVERFLOW_KIND, labelled
from trainer.loop.loss_normalization import LossNormalization
from trainer.runtime.metric_sums import WeightedSums, split_step_output
from trainer.loop.log_collector import merge_logged
from trainer.loop.pipeline_micro_batches import pipeline_micro_batches
from trainer.loop.step_accounting import TokenCount, counted
from trainer.strategies.base import TrainingStepForward
from trainer.strategies.sync_batchnorm import padding_micro_batch
from trainer.runtime.tensors import local_tensor
from trainer.api.hook_calls import call_step
from trainer.loop.optimizer_step import OptimizerStep, batch_end_outputs, train_batch_start, transfer_batch
from trainer.loop.skipped_batches import SkippedBatches
from trainer.observe.throughput import write_flops_by_module

if TYPE_CHECKING:
    from trainer.data.batch_plan import StepPlan
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)
_NO_CONTEXT = contextlib.nullcontext()  # (stateless: one object serves every step)
#: the hooks called inside an optimizer step (any of them overridden: every step takes the whole way)
_STEP_HOOKS = frozenset({"on_train_batch_start", "on_train_batch_end", "on_before_zero_grad", "on_before_backward",
                         "on_after_backward", "on_before_optimizer_step"})


class TrainStep:
    """The automatic-optimization step of one run (built by ``RankRun.fit`` once its parts exist)."""

    def __init__(self, run: RankRun):
        self.run = run
        self.normalization = LossNormalization(run.trainer.loss_normalization, run.data_parallel_size, run.device)
        self.counts_tokens = False  # training_step returns num_tokens: log tokens/s
        self.tokens_since_log = TokenCount(run.device)  # reduced on logging steps
        self.strategy_steps = 0  # steps run by a strategy that owns the step (pipeline)
        # the module's overrides of what the step does (read once: the hot path tests plain attributes)
        hooks = run.hooks
        self.custom_step, self.custom_backward = hooks.module_overrides("optimizer_step"), hooks.module_overrides("backward")
        self.custom_zero_grad = hooks.module_overrides("optimizer_zero_grad")
        self.custom_clipping = hooks.module_overrides("configure_gradient_clipping")
        self.step_lr: float = 0.0  # the learning rate after the step's own schedule (logged as train/lr)
        self.skipped_batch = SkippedBatches(run)  # training_step returned None
        self.fp16_skip = False  # fp16: the step's last micro-batch was skipped (no optimizer step, as Lightning's)
        # A quiet step of one micro-batch takes the short way (quiet_step) where nothing would run on the
        # whole way that the short one leaves out: no step hook or override, fp32, no clipping, no token
        # normalisation, no timed phases, a strategy that does not own the step.
        self.plain = not (run.strategy.owns_step or self.custom_step or self.custom_backward or self.custom_zero_grad
                          or self.custom_clipping or hooks.active & _STEP_HOOKS or run.precision.name != "fp32"
                          or run.trainer.gradient_clip_val is not None or self.normalization.by_tokens
                          or run.breakdown.enabled)

    def __call__(self, plan: StepPlan, batches: Iterator[Any], log_now: bool) -> dict[str, float] | None:
        """Train on one global batch; the metrics on a logging step (``log_now``), else None."""
        run = self.run
        if (not log_now and self.plain and len(plan.micro_batches) == 1 and plan.micro_batches[0].num_real
                and run.throughput.flops_per_step is not None):
            run.module_logs.begin_step(False)
            self.quiet_step(plan, batches)
            run.throughput.step(plan.global_count)
            run.module_logs.end_step(run.strategy)
            return None
        sums = WeightedSums(run.device) if log_now else None
        run.module_logs.begin_step(log_now)
        local_tokens = self.normalization.begin_step()
        run.breakdown.step_started()
        if run.strategy.owns_step:  # the one dispatch point: pipeline parallel runs each micro-batch itself
            run.optimizer.zero_grad(set_to_none=True)
            pipeline_micro_batches(run.strategy, self, plan, batches, sums, local_tokens)
            if run.nonfinite is not None:
                run.nonfinite.end_step(run.step + 1, run.epoch)
            stepped, found_inf, grad_norm = self.before_step(local_tokens, log_now)
            self.step_optimizer(stepped, found_inf)
        else:
            grad_norm = self.module_step(plan, batches, sums, local_tokens, log_now)
        run.breakdown.step_finished()
        run.throughput.step(plan.global_count)
        logged = run.module_logs.end_step(run.strategy)  # the step's self.log values (reduced on logging steps)
        if sums is None:
            return None
        return merge_logged(self.metrics(sums, grad_norm), logged, run.module_logs)

    def quiet_step(self, plan: StepPlan, batches: Iterator[Any]) -> None:
        """The short way of a quiet step of one real micro-batch (see ``plain``): the same calls in the same
        order as the whole way (``module_step``) takes for it, without what is off."""
        run, micro_batch = self.run, plan.micro_batches[0]
        batch = transfer_batch(run, next(batches), non_blocking=run.batch.pin_memory)
        with run.strategy.sync_context(run.wrapped, sync=True):
            with run.module_logs.micro_batch(micro_batch.num_real):
                output = self.forward(batch, run.batch_idx)
            loss, _, weight = self.step_loss(output, micro_batch)
            run.optimizer.zero_grad(set_to_none=True)
            if loss is not None:  # (None: a skipped batch, trainer/loop/skipped_batches.py)
                self.normalization.loss_to_backward(loss, weight, plan.global_count, None).backward()
        if run.nonfinite is not None:
            run.nonfinite.end_step(run.step + 1, run.epoch)
        self.step_optimizer(True, None)

    def forward(self, batch: Any, batch_idx: int) -> Any:
        """``training_step`` through the strategy's wrapper; called directly where the wrapper is the plain
        one and no hook would see it called (what ``nn.Module.__call__`` would do, without its ~1.5 us)."""
        wrapped = self.run.wrapped
        if type(wrapped) is TrainingStepForward and _unhooked(wrapped):
            return call_step(wrapped.module, "training_step", batch, batch_idx)
        return wrapped(batch, batch_idx)

    def step_loss(self, output: Any, micro_batch: Any) -> tuple[torch.Tensor | None, dict[str, Any], Any]:
        """A micro-batch's loss, metrics and weight from ``training_step``'s output; counts the micro-batch,
        notes the loss for the non-finite check and the tokens for tokens/s. ``(None, {}, None)`` for a
        batch ``training_step`` skipped by returning None (trainer/loop/skipped_batches.py)."""
        run = self.run
        loss, metrics = split_step_output(output, "training_step")
        if loss is None:
            return self.skipped_batch(output)
        run.micro_batch_done()
        if run.nonfinite is not None:
            run.nonfinite.observe(loss)  # tensor ops; read when settled
        num_tokens = metrics.pop("num_tokens", None)  # a count, not a metric to average
        if num_tokens is not None:  # a Python int stays one: no copy to the device per micro-batch
            num_tokens = counted(num_tokens, micro_batch.num_real > 0)
            self.note_tokens(num_tokens)
        return loss, metrics, self.normalization.weight(num_tokens, micro_batch.num_real)

    # ----- 1. the micro-batches ----------------------------------------------------------------------------
    def next_batch(self, batches: Iterator[Any]) -> Any:
        """The next micro-batch, on the device in the precision's input dtype (timed as "data"); through
        the batch transfer hooks where the module or datamodule overrides them."""
        run = self.run
        with run.breakdown.phase("data"):
            return run.precision.convert_input(transfer_batch(run, next(batches), non_blocking=run.batch.pin_memory))

    def note_tokens(self, num_tokens: Any) -> None:
        """Count a micro-batch's tokens for tokens/s (the same on every rank: the same code runs)."""
        self.counts_tokens = True
        self.tokens_since_log.add(num_tokens)

    def module_step(self, plan: StepPlan, batches: Iterator[Any], sums: WeightedSums | None,
                    local_tokens: TokenCount | None, log_now: bool) -> torch.Tensor | None:
        """The step of the module's own ``training_step``: every micro-batch of ``plan``, the last one in
        the optimizer closure, and the optimizer step. Returns the gradient norm where one was computed."""
        run, hooks = self.run, self.run.hooks
        last = len(plan.micro_batches) - 1
        for index in range(last):
            batch, batch_idx = self.start_micro_batch(batches)
            output = self.forward_backward(plan, index, batch, sums, local_tokens)
            if "on_train_batch_end" in hooks.active:
                hooks.call("on_train_batch_end", batch_end_outputs(output, len(plan.micro_batches)), batch, batch_idx)
        batch, batch_idx = self.start_micro_batch(batches)
        done: dict[str, Any] = {}

        def closure() -> Any:
            """The last micro-batch's forward and backward, then what precedes the optimizer step."""
            done["output"] = output = self.forward_backward(plan, last, batch, sums, local_tokens)
            done["stepped"], done["found_inf"], done["grad_norm"] = self.before_step(local_tokens, log_now)
            return split_step_output(output, "training_step")[0]

        if self.custom_step:
            step = OptimizerStep(run.optimizer, lambda: self.step_optimizer(done["stepped"], done["found_inf"]))
            run.module.optimizer_step(run.epoch, batch_idx, step, closure)
            if "output" not in done:
                raise RuntimeError(f"{type(run.module).__name__}.optimizer_step did not call optimizer_closure: under "
                                   "automatic optimization it runs the step's training_step and backward; call "
                                   "optimizer.step(closure=optimizer_closure)")
        else:
            closure()
            self.step_optimizer(done["stepped"], done["found_inf"])
        if "on_train_batch_end" in hooks.active:
            run.module_logs.peek_step_metrics(run.strategy)  # (logging steps: the reduced values, for the hook)
            hooks.call("on_train_batch_end", batch_end_outputs(done["output"], len(plan.micro_batches)), batch, batch_idx)
        return done["grad_norm"]

    def start_micro_batch(self, batches: Iterator[Any]) -> tuple[Any, int]:
        """Load the next micro-batch and call ``on_train_batch_start``; (batch, its batch_idx)."""
        run = self.run
        batch = self.next_batch(batches)
        batch_idx = run.batch_idx
        if "on_train_batch_start" in run.hooks.active:
            train_batch_start(run, batch, batch_idx)  # (raises EpochSkipped on the module's -1)
        return batch, batch_idx

    def forward_backward(self, plan: StepPlan, index: int, batch: Any, sums: WeightedSums | None,
                         local_tokens: TokenCount | None) -> Any:
        """``training_step`` and the backward of micro-batch ``index`` of ``plan`` (zeroing the
        gradients after the first one's forward, as Lightning); adds the metrics to ``sums`` (logging
        steps) and the tokens to ``local_tokens`` (tokens normalisation). Returns the step's output."""
        run, strategy, precision, timer, hooks = self.run, self.run.strategy, self.run.precision, self.run.breakdown, self.run.hooks
        nonfinite, normalization, micro_batch = run.nonfinite, self.normalization, plan.micro_batches[index]
        last = index == len(plan.micro_batches) - 1
        # FLOPs of one micro-batch's forward + backward, counted once (the first one).
        counting = run.throughput.flops_per_step is None and index == 0
        counter = FlopCounterMode(display=False) if counting else _NO_CONTEXT
        padding = padding_micro_batch() if micro_batch.num_real == 0 else _NO_CONTEXT  # no BN stats
        with strategy.sync_context(run.wrapped, sync=last), counter, padding:
            with timer.phase("forward"):  # the step's forward and its bookkeeping
                with precision.autocast(run.device), run.module_logs.micro_batch(micro_batch.num_real):
                    output = self.forward(batch, run.batch_idx)
                loss, metrics, weight = self.step_loss(output, micro_batch)
                if sums is not None and loss is not None:
                    sums.add({"loss": loss, **metrics}, weight)
            if index == 0:
                self.zero_grad()
            if last and precision.scaler is not None:
                self.fp16_skip = loss is None
            if loss is None:  # a skipped batch (trainer/loop/skipped_batches.py): no backward, no backward hooks
                counting = False  # (a forward alone: FLOPs are counted at a later step)
            else:
                if "on_before_backward" in hooks.active:
                    hooks.call("on_before_backward", loss)
                with timer.phase("backward"):
                    scaled = precision.scale_loss(normalization.loss_to_backward(loss, weight, plan.global_count,
                                                                                 local_tokens))
                    if self.custom_backward:
                        run.module.backward(scaled)
                    else:
                        scaled.backward()
        if loss is not None and "on_after_backward" in hooks.active:  # outside the sync context: synced gradients
            hooks.call("on_after_backward")
        if counting:
            run.throughput.set_flops_per_micro_batch(counter.get_total_flops(), len(plan.micro_batches))
            if run.rank == 0 and run.trainer.write_flops_file and \
                    (log_files := run.trainer.log_files_dir(run.run_dir)) is not None:
                write_flops_by_module(counter, os.path.join(log_files, "flops.txt"))
        if last and nonfinite is not None:
            nonfinite.end_step(run.step + 1, run.epoch)
        return output

    def zero_grad(self) -> None:
        """``on_before_zero_grad`` and ``optimizer_zero_grad`` (default: the gradients set to None)."""
        run = self.run
        if "on_before_zero_grad" in run.hooks.active:
            run.hooks.call("on_before_zero_grad", run.optimizer)
        if self.custom_zero_grad:
            run.module.optimizer_zero_grad(run.epoch, run.batch_idx - 1, run.optimizer)
        else:
            run.optimizer.zero_grad(set_to_none=True)

    # ----- 2. gradient normalisation and unscaling ---------------------------------------------------------
    def prepare_gradients(self, local_tokens: TokenCount | None) -> tuple[bool, torch.Tensor | None]:
        """Divide by the global token count (``tokens``) and unscale (fp16). Returns (whether the host
        takes the step, fp16's device overflow flag or None)."""
        run, strategy, scaler = self.run, self.run.strategy, self.run.precision.scaler
        stepped, found_inf = True, None
        with run.breakdown.phase("collectives"):
            # The local gradients (to_local per parameter), built only when something scales them.
            grads = ([local_tensor(p.grad) for p in run.module.parameters() if p.grad is not None]
                     if local_tokens is not None or scaler is not None else [])
            if local_tokens is not None:
                self.normalization.divide_by_global_tokens(grads, local_tokens, strategy)
            if scaler is not None:
                # Every rank takes the same decision: an overflow on any rank skips the step everywhere.
                # Where the gradients are already reduced to the same values on every rank (DDP's
                # all-reduce, ZeRO-1 included), each rank's flag is computed from identical tensors by
                # the same ops, so it is identical too: agreeing on it would be a collective for nothing.
                agree = None if strategy.gradients_replicated else strategy.all_reduce_max
                with labelled(OVERFLOW_KIND):
                    found_inf = scaler.unscale_found_inf(grads, agree)
                # (sync-free: True, the kernel skips on found_inf; a skipped last micro-batch: no step, no update)
                stepped = False if self.fp16_skip else run.fp16.decide(found_inf)
        return stepped, found_inf

    # ----- 3. the optimizer step ---------------------------------------------------------------------------
    def before_step(self, local_tokens: TokenCount | None, log_now: bool) -> tuple[bool, torch.Tensor | None, torch.Tensor | None]:
        """After the last backward: normalise and unscale, then (unless the step is known to overflow)
        ``on_before_optimizer_step`` and clipping. Returns (stepped, fp16's overflow flag, grad norm:
        inf on a logging step known to overflow)."""
        run, strategy, module, trainer = self.run, self.run.strategy, self.run.module, self.run.trainer
        stepped, found_inf = self.prepare_gradients(local_tokens)
        grad_norm = None
        # A step known to be skipped (the host path; sync-free: read on logging steps only, where the
        # step reads its metrics anyway) fires no hook and clips nothing; a logging step reports its
        # gradient norm as inf. A quiet sync-free step cannot know without a host sync: it runs the
        # hook and the clipping, and the kernel then skips the update.
        if found_inf is not None and not self.fp16_skip and \
                (not stepped or (log_now and run.fp16.sync_free and run.fp16.overflowed(found_inf))):
            return stepped, found_inf, (torch.full((), math.inf) if log_now else None)
        with run.breakdown.phase("optimizer"):
            if "on_before_optimizer_step" in run.hooks.active:
                run.hooks.call("on_before_optimizer_step", run.optimizer)
            clip, algorithm = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
            if self.custom_clipping:
                if log_now:  # reported on logging steps: the norm before the module's clipping
                    grad_norm = strategy.grad_norm(module)
                module.configure_gradient_clipping(run.optimizer, clip, trainer.gradient_clip_algorithm_arg)
            elif clip is not None and algorithm != "value":
                grad_norm = strategy.clip_grad_norm(module, clip)
            else:
                if log_now:  # reported on logging steps even without clipping (a reduction under FSDP)
                    grad_norm = strategy.grad_norm(module)
                if clip is not None:  # element-wise: each rank's shard alone is enough
                    strategy.clip_grad_value(module, clip)
        return stepped, found_inf, grad_norm

    def step_optimizer(self, stepped: bool, found_inf: torch.Tensor | None) -> None:
        """The optimizer step and the schedule (unless fp16 skips on the host). The gradients stay
        until the next step's first forward has run (Lightning's place for zero_grad)."""
        run = self.run
        run.optimizer_stepped()
        with run.breakdown.phase("optimizer"):
            if stepped:
                if found_inf is None:
                    run.strategy.optimizer_step(run.optimizer)
                else:
                    run.fp16.step(run.optimizer, found_inf)
                run.lr_scheduling.after_optimizer_step()  # sync-free fp16: a skipped step advances it too
            elif self.fp16_skip:  # (Lightning's fp16: a step whose last micro-batch returned None; the schedule goes on)
                run.lr_scheduling.after_optimizer_step()
            else:
                log.info("step %d: gradient overflow, skipped (loss scale now %g)", run.step + 1,
                         run.precision.scaler.scale)
            self.step_lr = run.optimizer.param_groups[0]["lr"]  # train/lr: before an epoch's scheduler steps
            if run.ends_epoch:  # interval="epoch" schedulers, before the last micro-batch's on_train_batch_end
                run.lr_scheduling.after_epoch()

    # ----- 4. the metrics (logging steps) ------------------------------------------------------------------
    def metrics(self, sums: WeightedSums, grad_norm: torch.Tensor | None) -> dict[str, float]:
        """The logging step's metrics: the non-finite check settled, the sums reduced, host reads."""
        run, strategy = self.run, self.run.strategy
        run.settle_nonfinite(run.step + 1)
        metrics = sums.reduce("train/", strategy)
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/lr"] = float(self.step_lr)
        if run.precision.scaler is not None:
            run.fp16.on_logging_step(run.step + 1, metrics)
        tokens = float(strategy.all_reduce_sum(self.tokens_since_log.total())) if self.counts_tokens else None
        self.tokens_since_log.reset()
        metrics.update(run.throughput.metrics(tokens))
        metrics.update(run.breakdown.metrics())
        return metrics


# torch's registries of global module hooks (torch.nn.modules.module.register_module_*_hook: FlopCounterMode's
# module tracker, a user's), private dicts changed in place; one missing (another torch): always counted as hooked.
_GLOBAL_HOOKS = tuple(getattr(torch.nn.modules.module, name, None) for name in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called",
    "_global_backward_pre_hooks", "_global_backward_hooks"))
_GLOBAL_HOOKS_UNKNOWN = any(registry is None for registry in _GLOBAL_HOOKS)


def _unhooked(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs its ``forward`` and nothing else: no hook of its own or global one,
    not compiled in place (``nn.Module.compile``)."""
    own = module.__dict__
    return not (_GLOBAL_HOOKS_UNKNOWN or any(_GLOBAL_HOOKS) or own.get("_compiled_call_impl") is not None
                or own.get("_forward_pre_hooks") or own.get("_forward_hooks") or own.get("_backward_pre_hooks")
                or own.get("_backward_hooks"))
