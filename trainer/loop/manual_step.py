"""Manual optimization (``self.automatic_optimization = False``, Lightning's name): the module steps
its optimizers itself inside ``training_step``.

The trainer then calls ``training_step(batch, batch_idx)`` once per optimizer step (one micro-batch
per rank: ``trainer.accumulate_grad_batches > 1`` is refused, as in Lightning; accumulate by hand with
``self.no_backward_sync()``) and does no backward, step, zero_grad or clipping itself. The module uses:

- ``self.optimizers()``: one `LightningOptimizer` or a list (Lightning's
  shape); its ``step(closure=None, **kwargs)``
  goes through the strategy (ZeRO-1) and the precision (fp16: unscale this optimizer's gradients,
  skip on an overflow on any rank; the one loss scale is updated once per ``training_step``);
- ``self.lr_schedulers()``: the schedulers, stepped by the module (the trainer never steps them);
- ``self.manual_backward(loss)``: ``loss`` is this rank's micro-batch mean. It is multiplied by
  ``num_real x data-parallel ranks / global count`` (what the automatic path applies), so after the
  gradient average over ranks the gradient is that of the global-batch mean, exactly as one process
  on the same global batch, also for a short last batch where ranks hold different real counts
  (a padding micro-batch, with no real sample, contributes zero); fp16 scales it;
- ``self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm="norm"|"value")``:
  clips that optimizer's gradients (the norm over every rank's shards under FSDP);
- ``with self.no_backward_sync(): ...``: backward passes inside skip the gradient sync (hand
  accumulation); the first backward outside syncs the accumulated sum.

Gradient sync per strategy: DDP runs the step under ``no_sync()`` and ``manual_backward`` averages the
gradients itself (one coalesced all-reduce per backward, logged as a gradient round), since a step
that runs several backward passes on one forward (a GAN) is not what DDP's reducer expects; FSDP
reduce-scatters in its backward hooks, switched off by ``set_requires_gradient_sync(False)``: every
parameter is in a unit below the root there (trainer/strategies/fsdp.py), so each ``manual_backward``
reduces what it computed, however often a network is called in the step. ``opt.step()`` inside
``no_backward_sync()`` is refused (it would step on unsynced gradients).

``toggle_optimizer`` / ``untoggle_optimizer`` (trainer/api/manual_optimization.py) find the module's
parameters by name (``param_names``): under FSDP the module may hold a gathered copy of a parameter
the optimizer holds sharded, and both get the flag.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Iterator

import torch

from trainer.api.optimizer import LightningOptimizer
from trainer.runtime.comms_log import GRADIENT_KIND, OVERFLOW_KIND, labelled
from trainer.runtime.metric_sums import WeightedSums, split_step_output
from trainer.loop.log_collector import merge_logged
from trainer.precision.fp16_step import read_finite
from trainer.strategies.base import Strategy
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.sync_batchnorm import padding_micro_batch
from trainer.runtime.tensors import local_tensor
from trainer.loop.optimizer_step import batch_end_outputs, train_batch_start, transfer_batch

if TYPE_CHECKING:
    from trainer.data.batch_plan import StepPlan

log = logging.getLogger(__name__)

CLIP_ALGORITHMS = ("norm", "value")


class _Params:
    """Duck-types a module for ``Strategy.grad_norm`` / ``clip_grad_norm`` (they call ``parameters()``)."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self._params = params

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return iter(self._params)


def _params_of(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def check_manual_setup(trainer: Any, strategy: Any, optimizers: list) -> None:
    """What manual optimization refuses, each with what to change (same answer on every rank)."""
    if trainer.accumulate_grad_batches > 1:
        raise ValueError(
            f"manual optimization (automatic_optimization = False) with trainer.accumulate_grad_batches="
            f"{trainer.accumulate_grad_batches} (or a data.global_batch_size that implies it): the module steps "
            "its optimizers itself, so accumulate by hand (self.no_backward_sync() on the non-final backward "
            "passes); set trainer.accumulate_grad_batches=1 (as Lightning requires)")
    if trainer.gradient_clip_val is not None:
        raise ValueError(
            f"trainer.gradient_clip_val={trainer.gradient_clip_val!r} with manual optimization (automatic_optimization "
            "= False): the trainer does not step, so it cannot clip; call self.clip_gradients(optimizer, "
            "gradient_clip_val=..., gradient_clip_algorithm='norm') before opt.step() and unset trainer.gradient_clip_val")
    if strategy.owns_step:
        raise ValueError(f"strategy={strategy.name} runs each micro-batch's forward and backward itself, which manual "
                         "optimization (automatic_optimization = False) cannot do; use strategy=ddp or fsdp")
    if trainer.loss_normalization != "samples":
        raise ValueError(f"trainer.loss_normalization={trainer.loss_normalization!r} with manual optimization: "
                         "manual_backward scales the loss by sample counts only; set trainer.loss_normalization=samples "
                         "(or normalise by tokens inside training_step)")
    if len(optimizers) > 1 and strategy.zero1:
        raise ValueError(f"strategy.zero1=true with {len(optimizers)} optimizers: ZeRO-1 shards one optimizer; "
                         "set strategy.zero1=false or return one optimizer")


def refuse_shared_under_loss_scaling(optimizers: list, scaler: Any) -> None:
    """Optimizers may share a parameter (each steps it with the gradient it finds, as in Lightning),
    except under fp16 loss scaling, which unscales each optimizer's gradients once per step: a shared
    gradient would be unscaled twice."""
    seen: dict[int, int] = {}
    for index, optimizer in enumerate(optimizers):
        for group in optimizer.param_groups:
            for param in group["params"]:
                if seen.setdefault(id(param), index) != index and scaler is not None:
                    raise ValueError(f"configure_optimizers: optimizers {seen[id(param)]} and {index} share a parameter "
                                     f"of shape {tuple(param.shape)}, which fp16 loss scaling would unscale twice; "
                                     "give each parameter to one optimizer, or use precision bf16-mixed / 32")


def setup_optimizers(run: Any, optimizer: Any, schedulers: list) -> tuple[Any, ManualStep | None]:
    """At fit start, after ``configure_optimizers`` (``optimizer``: one, or a list under manual
    optimization): set the optimizers up with the strategy. Returns ``(the optimizer, or the list of
    them, that checkpoints save; the ManualStep under manual optimization, else None)``; the step is
    attached to the module (``self.optimizers()`` ...). Automatic: ``self.optimizers()`` and
    ``self.lr_schedulers()`` give the optimizer and schedulers to read (the trainer steps them)."""
    names = {id(p): name for name, p in run.module.named_parameters()}  # the optimizers' (sharded) parameters
    if not isinstance(optimizer, list):
        optimizer = run.strategy.setup_optimizer(optimizer)
        run.module.__dict__["_manual_step"] = _Configured([optimizer], schedulers, names)
        return optimizer, None
    check_manual_setup(run.trainer, run.strategy, optimizer)
    refuse_shared_under_loss_scaling(optimizer, run.precision.scaler)
    optimizers = [run.strategy.setup_optimizer(o) for o in optimizer]
    step = ManualStep(run, optimizers, schedulers, names)
    run.count_optimizer_calls()  # global_step counts the module's opt.step() calls (trainer/loop/step_limits.py)
    run.module.__dict__["_manual_step"] = step  # not a submodule nor a parameter: a plain attribute
    return (optimizers[0] if len(optimizers) == 1 else optimizers), step


class _Configured:
    """Automatic optimization: what ``self.optimizers()`` / ``self.lr_schedulers()`` read (as Lightning
    allows there); the optimizers are the user's own, stepped by the trainer."""

    active = False

    def __init__(self, optimizers: list, schedulers: list, param_names: dict[int, str]):
        self.optimizers = [LightningOptimizer(o, _automatic_step) for o in optimizers]
        self.schedulers, self.param_names = schedulers, param_names


def _automatic_step(optimizer: torch.optim.Optimizer, closure: Any, kwargs: dict) -> None:
    raise RuntimeError(f"{type(optimizer).__name__}.step() from self.optimizers() under automatic optimization: the "
                       "trainer steps the optimizer after training_step; set self.automatic_optimization = False in "
                       "__init__ to step it yourself")


class ManualStep:
    """The run side: the training step under manual optimization and what the module's calls do."""

    def __init__(self, run: Any, optimizers: list[torch.optim.Optimizer], schedulers: list, param_names: dict[int, str]):
        self.run = run
        self.optimizers = [LightningOptimizer(o, self.step) for o in optimizers]
        self.schedulers, self.param_names = schedulers, param_names
        self.active = False  # inside training_step
        self._factor = 1.0
        self._sync = True
        # fp16, this step: id(optimizer) -> gradients finite (a bool read to the host), or the device
        # overflow flag where the optimizer steps sync-free (trainer/precision/fp16_step.py)
        self._unscaled: dict[int, bool | torch.Tensor] = {}
        self._found: torch.Tensor | None = None  # fp16: the step's overflow flag, once an optimizer unscaled
        self._overflow = False
        from torch.nn.parallel import DistributedDataParallel

        self._ddp = isinstance(run.wrapped, DistributedDataParallel)

    # ----- what the module's calls do ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"manual_backward takes a loss tensor, got {type(loss).__name__}")
        scaled = loss * self._factor if self._factor != 1.0 else loss
        hooks = self.run.hooks
        hooks.call("on_before_backward", loss)
        scaled = self.run.precision.scale_loss(scaled)
        if hooks.module_overrides("backward"):
            self.run.module.backward(scaled)
        else:
            scaled.backward()
        if self._ddp and self._sync:
            self._average_gradients()
        hooks.call("on_after_backward")

    def _average_gradients(self) -> None:
        """DDP: average every gradient over the ranks (the ones synced before are equal on every rank,
        so averaging them again keeps them). Flat all-reduces per dtype of at most ``bucket_cap_mb``
        (DDP's default 25 MB) each."""
        grads = [p.grad for p in self.run.module.parameters() if p.grad is not None]
        world = torch.distributed.get_world_size()
        cap = (self.run.strategy.bucket_cap_mb or 25) * 2**20
        with labelled(GRADIENT_KIND):
            buckets: list[list[torch.Tensor]] = []
            open_bucket: dict[torch.dtype, tuple[list[torch.Tensor], int]] = {}  # dtype -> (bucket, bytes)
            for grad in grads:
                bucket, size = open_bucket.get(grad.dtype, (None, 0))
                if bucket is None or size >= cap:
                    bucket, size = [], 0
                    buckets.append(bucket)
                bucket.append(grad)
                open_bucket[grad.dtype] = (bucket, size + grad.numel() * grad.element_size())
            for group in buckets:
                flat = torch._utils._flatten_dense_tensors(group)
                flat.div_(world)
                torch.distributed.all_reduce(flat)
                for grad, synced in zip(group, torch._utils._unflatten_dense_tensors(flat, group)):
                    grad.copy_(synced)

    @contextlib.contextmanager
    def skip_sync(self) -> Iterator[None]:
        strategy, wrapped = self.run.strategy, self.run.wrapped
        previous, self._sync = self._sync, False
        try:
            if self._ddp:  # the step runs under no_sync() already; manual_backward skips its all-reduce
                yield
            else:  # FSDP: set_requires_gradient_sync(False) on every unit until the end of the block
                with strategy.sync_context(wrapped, sync=False):
                    yield
        finally:
            self._sync = previous
            if not self._ddp and previous:
                strategy.sync_context(wrapped, sync=True)

    def _unscale(self, optimizer: torch.optim.Optimizer) -> bool | torch.Tensor:
        """fp16: unscale ``optimizer``'s gradients once per step; True when finite on every rank (one
        host read), or where the step is sync-free the device overflow flag (no read)."""
        key = id(optimizer)
        if key not in self._unscaled:
            strategy, scaler = self.run.strategy, self.run.precision.scaler
            grads = [local_tensor(p.grad) for p in _params_of(optimizer) if p.grad is not None]
            agree = None if strategy.gradients_replicated else strategy.all_reduce_max
            with labelled(OVERFLOW_KIND):
                found = scaler.unscale_found_inf(grads, agree)
            self._found = found if self._found is None else torch.maximum(self._found, found)
            self._unscaled[key] = found if self.run.fp16.sync_free else read_finite(found)
            self._overflow |= self._unscaled[key] is False
        return self._unscaled[key]

    def clip(self, optimizer: Any, value: float | None, algorithm: str) -> torch.Tensor | None:
        optimizer = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        if algorithm not in CLIP_ALGORITHMS:
            raise ValueError(f"clip_gradients: gradient_clip_algorithm={algorithm!r}; it is one of {list(CLIP_ALGORITHMS)}")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"clip_gradients: gradient_clip_val={value!r}; it must be a number > 0 (or None: no clipping)")
        if self.run.precision.scaler is not None and self._unscale(optimizer) is False:
            return None  # overflowed: the step is skipped anyway (sync-free: clipped, then skipped in the kernel)
        params = _params_of(optimizer)
        if algorithm == "norm":
            return self.run.strategy.clip_grad_norm(_Params(params), float(value))
        with torch.no_grad():  # element-wise: each rank's shard alone is enough
            for p in params:
                if p.grad is not None:
                    local_tensor(p.grad).clamp_(-value, value)
        return None

    def step(self, optimizer: torch.optim.Optimizer, closure: Any, kwargs: dict) -> Any:
        """``opt.step(closure, **kwargs)`` of an optimizer of ``self.optimizers()``; every call counts
        in global_step, an fp16-skipped one too (as Lightning)."""
        if not self.active:
            raise RuntimeError("an optimizer of self.optimizers() can only step inside training_step")
        if not self._sync:  # on several ranks the step would use this rank's unsynced (FSDP: unreduced) gradients
            raise RuntimeError("opt.step() inside self.no_backward_sync(): the gradients are not synced across ranks "
                               "there; step after the block, once a manual_backward outside it has synced them")
        strategy = self.run.strategy
        # A strategy that steps the optimizer its own way (ZeRO-1, a custom one) gets the call it knows.
        direct = (self.run.precision.scaler is None and strategy.stepping_optimizer(optimizer) is optimizer
                  and type(strategy).optimizer_step in (Strategy.optimizer_step, DDPStrategy.optimizer_step))
        if direct:
            # As Lightning: the optimizer calls the closure (LBFGS: several times), and
            # on_before_optimizer_step runs after it, before the update.
            def wrapped() -> Any:
                result = closure() if closure is not None else None
                self.run.hooks.call("on_before_optimizer_step", optimizer)
                return result

            result = optimizer.step(closure=wrapped, **kwargs)
        else:
            if kwargs:
                raise ValueError(f"optimizer.step(**{sorted(kwargs)}) under fp16 loss scaling or ZeRO-1: the trainer "
                                 "steps the optimizer itself there and passes no arguments; call step() without them")
            result = closure() if closure is not None else None
            self.optimizer_step(optimizer)
        self.run.optimizer_called()
        return result

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.run.precision.scaler is not None:
            finite = self._unscale(optimizer)
            del self._unscaled[id(optimizer)]  # its next step (if any) unscales new gradients
            if finite is False:
                log.info("step %d: gradient overflow in %s, its step skipped", self.run.step + 1, type(optimizer).__name__)
                return
            if finite is not True:  # sync-free: the device flag; the kernel skips an overflowing step
                self.run.hooks.call("on_before_optimizer_step", optimizer)
                self.run.fp16.step(optimizer, finite)
                return
        self.run.hooks.call("on_before_optimizer_step", optimizer)
        self.run.strategy.optimizer_step(optimizer)

    # ----- the trainer's step -------------------------------------------------------------------------
    def train_step(self, plan: StepPlan, batches: Iterator[Any], log_now: bool) -> dict[str, float] | None:
        """One optimizer step of the loop: ``training_step`` on this rank's one micro-batch."""
        run = self.run
        strategy, precision, timer = run.strategy, run.precision, run.breakdown
        (micro_batch,) = plan.micro_batches  # accumulate_grad_batches=1 (check_manual_setup)
        timer.step_started()
        with timer.phase("data"):
            batch = precision.convert_input(transfer_batch(run, next(batches), non_blocking=run.batch.pin_memory))
        # The automatic path's factor (trainer/loop/rank_run.py): the micro-batch's share of the global-batch mean.
        self._factor = micro_batch.num_real * run.data_parallel_size / plan.global_count
        self._unscaled.clear()
        self._found, self._overflow = None, False
        padding = padding_micro_batch() if micro_batch.num_real == 0 else contextlib.nullcontext()
        no_sync = run.wrapped.no_sync() if self._ddp else contextlib.nullcontext()

        run.module_logs.begin_step(log_now)
        batch_idx = run.batch_idx
        train_batch_start(run, batch, batch_idx)  # (raises EpochSkipped on the module's -1)
        self.active = True
        try:
            with timer.phase("forward"), padding, no_sync, precision.autocast(run.device), \
                    run.module_logs.micro_batch(micro_batch.num_real):
                output = run.wrapped(batch, run.batch_idx)
        finally:
            self.active = False
        run.micro_batch_done()
        run.batch_trained()
        if run.hooks.any("on_train_batch_end"):
            run.module_logs.peek_step_metrics(run.strategy)  # (logging steps: the reduced values, for the hook)
            run.hooks.call("on_train_batch_end", batch_end_outputs(output, None), batch, batch_idx)
        if precision.scaler is not None and self._found is not None:  # once per training_step (GradScaler's protocol)
            precision.scaler.update(self._found)
            if self._overflow:
                log.info("step %d: gradient overflow (loss scale now %g)", run.step + 1, precision.scaler.scale)
        loss, metrics = split_step_output(output, "training_step")
        if run.nonfinite is not None:
            if loss is not None:
                run.nonfinite.observe(loss)
            run.nonfinite.end_step(run.step + 1, run.epoch)
        timer.step_finished()
        run.throughput.step(plan.global_count)
        logged = run.module_logs.end_step(strategy)  # the step's self.log values (reduced on logging steps)
        if not log_now:
            return None
        sums = WeightedSums(run.device)
        sums.add({"loss": loss, **metrics} if loss is not None else metrics, micro_batch.num_real)
        run.settle_nonfinite(run.step + 1)
        reduced = sums.reduce("train/", strategy)
        for index, optimizer in enumerate(self.optimizers):
            suffix = "" if len(self.optimizers) == 1 else f"/optimizer{index}"
            reduced[f"train/lr{suffix}"] = float(optimizer.param_groups[0]["lr"])
        if precision.scaler is not None:
            run.fp16.on_logging_step(run.step + 1, reduced)
        reduced.update(run.throughput.metrics(None))
        reduced.update(timer.metrics())
        return merge_logged(reduced, logged, run.module_logs)
