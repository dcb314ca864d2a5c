"""``self.log`` / ``self.log_dict``: values a module logs from its steps and hooks (Lightning's API).

The loop owns one :class:`LogCollector` per run and tells it where the run is: which stage
(``"train"``, ``"validate"``, or any other stage string such as ``"test"``), which micro-batch and
its weight (real samples), and whether this optimizer step is a logging step. ``TrainModule.log``
hands each value to it.

Values stay on their device: per micro-batch the collector only adds ``value * weight`` (mean),
``value`` (sum) or a running max / min into device tensors. An ``on_step`` value is not even
looked at on a step that is not a logging step (it would never be written). The reduction across
ranks, one host read and a few collectives, happens on logging steps (``on_step`` values), at
training-epoch ends and at the end of each evaluation run (``on_epoch`` values).

Across ranks (``sync_dist=True``, our default): the names are agreed first (one object gather, and
only when some rank logged something), so a name logged on some ranks only is reduced over the
union (a rank that did not log it adds nothing) and never hangs a collective; the same name with a
different ``reduce_fx`` / ``sync_dist`` on two ranks is an error naming both. ``"mean"`` is the
sample-weighted mean over every rank's micro-batches (exact, independent of the world size),
``"sum"`` the sum, ``"max"`` / ``"min"`` the extreme. ``sync_dist=False`` keeps this rank's own
aggregate (rank 0's is the one the loggers write).

A torchmetrics object logged as a value: its forward value of the batch is a step value (reduced as
any value); its epoch value is ``compute()``, which syncs the metric's own states over the ranks (so
it is not reduced again), after which every metric object the stage logged is reset. A batch that
counts for nothing (padding) leaves the module's metric objects as they were.

Names: a name the user logs is the user's. Where the trainer reports a value under the same name
(``train/loss``, ``val/loss``, ...), the user's value is the one written and the trainer's is not.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from trainer.loop.log_hooks import HOOKS, allowed_hooks, calling_hook
from trainer.runtime import distributed
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.metric_objects import (MetricStates, compute_value, forward_value, is_metric,
                                            is_metric_collection, module_metrics)

REDUCE_FX = ("mean", "sum", "max", "min")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogOptions:
    """How one name is aggregated and where it goes (``self.log``'s arguments, resolved)."""

    on_step: bool
    on_epoch: bool
    reduce_fx: str
    sync_dist: bool
    prog_bar: bool
    logger: bool
    metric: bool = False  # the value is a torchmetrics object: its epoch value is its compute()

    @property
    def agreed(self) -> bool:
        """Whether every rank takes part in this name's reduction (synced values, metric objects)."""
        return self.sync_dist or self.metric


@dataclass
class _Aggregate:
    """One name's running aggregate on this rank: ``total`` (sum of value x weight, sum, max or min:
    a Python float or a device tensor) and ``weight`` (a Python float; mean only); or, for the epoch
    value of a metric object, ``metric`` (computed when the epoch's values are reduced)."""

    options: LogOptions
    total: Any = None
    weight: float = 0.0
    metric: Any = None

    def add(self, value: Any, weight: float) -> None:
        fx = self.options.reduce_fx
        if fx == "mean":
            value, self.weight = value * weight, self.weight + weight
        if self.total is None:
            self.total = value
        elif fx in ("mean", "sum"):
            self.total = self.total + value
        else:
            self.total = _extreme(self.total, value, fx)


def _extreme(a: Any, b: Any, fx: str) -> Any:
    """max / min of two floats or tensors; a Python float meets a tensor through ``clamp`` (no copy
    of the float to the device, which would wait for it)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.maximum(a, b) if fx == "max" else torch.minimum(a, b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        tensor, number = (a, b) if isinstance(a, torch.Tensor) else (b, a)
        return tensor.clamp(min=number) if fx == "max" else tensor.clamp(max=number)
    return max(a, b) if fx == "max" else min(a, b)


@dataclass
class _Scope:
    """The aggregates of one scope: a logging step's, or one epoch / evaluation run's."""

    values: dict[str, _Aggregate] = field(default_factory=dict)


def _checked_value(name: str, value: Any) -> Any:
    """A Python float, or a detached float64 tensor of one element (metadata checks only: no sync)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...): the value is a tensor of shape {tuple(value.shape)}; log a "
                             "Python number or a tensor with one element (reduce it first, e.g. .mean())")
        if value.is_complex():
            raise ValueError(f"self.log({name!r}, ...): the value is a complex tensor; log a real number")
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, numbers.Real):
        return float(value)
    if is_metric_collection(value):
        raise TypeError(f"self.log({name!r}, ...): the value is a MetricCollection; log it with self.log_dict")
    raise TypeError(f"self.log({name!r}, ...): the value is a {type(value).__name__}; log a Python number, a "
                    "one-element tensor or a torchmetrics Metric")


class _MicroBatch:
    """``LogCollector.micro_batch``'s context (a plain class: it runs for every micro-batch)."""

    __slots__ = ("logs", "weight", "saved")

    def __init__(self, logs: LogCollector, weight: int | float):
        self.logs, self.weight, self.saved = logs, weight, None

    def __enter__(self) -> None:
        logs = self.logs
        logs._weight = logs._batch_weight = self.weight
        if self.weight == 0 and logs.module is not None:
            if logs._padding_metrics is None:
                logs._padding_metrics = module_metrics(logs.module)
            self.saved = MetricStates(logs._padding_metrics) if logs._padding_metrics else None

    def __exit__(self, *exc: Any) -> None:
        self.logs._weight = None
        if self.saved is not None:
            self.saved.restore()


class LogCollector:
    """Collects what a module logs during a run and reduces it (see the module docstring).

    The loop drives it: :meth:`stage` (or :meth:`begin` / :meth:`end`) around a stage,
    :meth:`micro_batch` around each step call, :meth:`begin_step` / :meth:`end_step` around an
    optimizer step, and :meth:`epoch_metrics` at the end of an epoch or evaluation run
    (:meth:`discard` after a pass whose values are not logged: the sanity check). Which stage and
    level a value belongs to follows the hook that logged it (trainer/loop/log_hooks.py). An
    evaluation stage (validation, test) is::

        with run.module_logs.stage("test"):
            for index, (weight, batch) in ...:          # weight: the batch's real samples (0: padding)
                with run.module_logs.micro_batch(weight):
                    output = module.test_step(batch, index)
            # hooks that may log epoch values (e.g. an on_test_epoch_end) go here, inside the stage
        logged = run.module_logs.epoch_metrics("test", run.strategy)   # on every rank: collectives

    Metric objects (torchmetrics): the forward value of the batch is the step value, ``compute()``
    the epoch value; every metric object logged in a stage is reset once that stage's epoch values
    are reduced (or discarded).
    """

    def __init__(self, device: torch.device, refused: str | None = None, module: torch.nn.Module | None = None):
        self.device = device
        self.refused = refused  # why self.log cannot work in this run (e.g. under the pipeline), or None
        self.module = module  # whose metric objects a padding batch must leave as they were
        self._stages: list[str | None] = [None]  # the innermost last; None: no stage runs
        self._weight: float | None = None  # the current micro-batch's weight; None: a hook
        self._batch_weight: float | None = None  # the last micro-batch's weight (its batch-end hooks)
        self._in_step = False  # between begin_step and end_step (training)
        self._log_step = False  # this optimizer step is a logging step
        self._step = _Scope()
        self._pending = _Scope()  # on_step values logged between two steps: the next step's
        self._epochs: dict[str, _Scope] = {}
        self._options: dict[str, dict[str, LogOptions]] = {}  # stage -> name -> options (first call's)
        self._metrics: dict[str, dict[str, Any]] = {}  # stage -> name -> metric object logged since it began
        self._known_metrics: dict[str, Any] = {}  # name -> metric object, over the run
        #: output names the progress bar shows (``prog_bar=True``) and names kept off the loggers
        self.prog_bar: set[str] = set()
        self.hidden: set[str] = set()
        #: training values as this rank logged them in the latest batch (tensors, not reduced); the
        #: reduced values replace them on logging steps (``trainer.callback_metrics`` reads both)
        self.batch_values: dict[str, Any] = {}
        #: a name logged both on_step and on_epoch, under its own name: its latest step or epoch value
        #: (what Lightning's callback_metrics hold besides name_step / name_epoch)
        self.bare: dict[str, Any] = {}
        #: the trainer's own values of the latest logging step whose names the user logs (not written)
        self.shadowed: dict[str, float] = {}
        self._anyone_logs = False  # some rank has logged a synced name (learnt at reductions)
        self._padding_metrics: list[Any] | None = None
        self._trainer_wrote: set[str] = set()  # the trainer's own names written at this training step
        self._reduced: set[str] = set()  # stages whose epoch values were reduced since their last step

    # ----- where the run is (called by the loop) ---------------------------------------------------
    @property
    def current_stage(self) -> str | None:
        return self._stages[-1]

    def begin(self, stage: str) -> None:
        """Enter ``stage`` ("train", "validate", "test", ...). Its epoch aggregates hold what a start
        hook logged before (e.g. ``on_train_start``); each epoch's reduction empties them."""
        self._stages.append(stage)
        self._epochs.setdefault(stage, _Scope())

    def end(self) -> None:
        """Leave the current stage (back to the one it interrupted, e.g. training after a validation)."""
        self._stages.pop()
        self._weight = self._batch_weight = None

    @contextlib.contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        self.begin(stage)
        try:
            yield
        finally:
            self.end()

    def micro_batch(self, weight: int | float) -> _MicroBatch:
        """Around one step call: values logged inside weigh ``weight`` (the batch's real samples;
        0 for a padding batch, whose values are not counted and whose updates of the module's
        metric objects are undone)."""
        return _MicroBatch(self, weight)

    def begin_step(self, log_now: bool) -> None:
        """An optimizer step starts (training); ``log_now``: it is a logging step."""
        self._in_step, self._log_step = True, log_now
        self._reduced.discard("train")
        if self._trainer_wrote:
            self._trainer_wrote = set()
        # A quiet step drops what was logged for it before it began; empty scopes are kept (no new
        # objects on the steps that log nothing).
        if log_now:
            self._step, self._pending = self._pending, _Scope()
        else:
            if self._step.values:
                self._step = _Scope()
            if self._pending.values:
                self._pending = _Scope()

    def end_step(self, strategy: Any) -> dict[str, float] | None:
        """The step's ``on_step`` values, reduced (logging steps; on every rank), or None."""
        self._in_step = False
        self._batch_weight = None
        if not self._log_step:
            return None
        reduced = self._reduce(self._step, strategy, "_step", always_agree=True)
        self.batch_values.clear()  # the reduced values take over
        return reduced

    def peek_step_metrics(self, strategy: Any) -> None:
        """On a logging step, before the step's last ``on_train_batch_end``: the step's values so far,
        reduced, shown in ``callback_metrics`` (as Lightning's, synced when read there); :meth:`end_step`
        reduces them again with what that hook logs. A collective on logging steps only."""
        if self._log_step:
            self.batch_values.update(self._reduce(self._step, strategy, "_step", always_agree=True))

    @contextlib.contextmanager
    def epoch_end_hooks(self) -> Iterator[None]:
        """Around ``on_train_epoch_end`` (values logged there are epoch values: its row in the hooks' table)."""
        yield

    def epoch_metrics(self, stage: str, strategy: Any) -> dict[str, float]:
        """The ``on_epoch`` values of ``stage`` since it began (or since its last epoch), reduced
        over the ranks (on every rank), metric objects computed; the aggregates start again empty
        and the stage's metric objects are reset."""
        scope = self._epochs.get(stage, _Scope())
        self._epochs[stage] = _Scope()
        self._reduced.add(stage)
        try:
            out = self._reduce(scope, strategy, "_epoch", always_agree=stage != "train", compute=True)
        finally:
            self._reset_metrics(stage)
        if stage == "train" and (both := sorted(self._trainer_wrote & set(out))):
            # A name first logged in an epoch-end hook: the trainer had written its own value under it at
            # this step already (from now on only the user's is written).
            rank_zero_warn(log, "self.log names %s, first logged at this epoch end, were also written by the trainer "
                           "at this step (its own values under those names); from now on only yours are written",
                           both)
        return out

    def discard(self, stage: str) -> None:
        """Drop what ``stage`` collected without logging it (a sanity pass): its aggregates and the
        state of the metric objects it logged, as if it had not run."""
        self._epochs[stage] = _Scope()
        self._reset_metrics(stage)

    def _reset_metrics(self, stage: str) -> None:
        for metric in self._metrics.pop(stage, {}).values():
            metric.reset()

    def pending_epoch_values(self, stage: str) -> bool:
        """Whether ``stage`` holds on_epoch values not yet reduced (this rank)."""
        return bool(self._epochs.get(stage, _Scope()).values)

    def known_names(self) -> set[str]:
        """Every metric name ``self.log`` calls of this run produce (in any stage, logged or not yet)."""
        names = set()
        for options_by_name in self._options.values():
            for name, options in options_by_name.items():
                both = options.on_step and options.on_epoch
                names.update((name + "_step", name + "_epoch") if both else (name,))
        return names

    def merge(self, metrics: dict[str, float], logged: dict[str, float] | None) -> dict[str, float]:
        """The trainer's ``metrics`` with the ``self.log`` values added. A name the user logs (now or
        at any time in this run) is the user's: the trainer's value under that name is not written
        (it stays in :attr:`shadowed`, e.g. for the progress bar)."""
        user = self.known_names()
        self.shadowed.clear()  # (in place: the progress bar holds it)
        self.shadowed.update({name: metrics.pop(name) for name in list(metrics) if name in user})
        if self.current_stage == "train":  # (a training step's merge)
            self._trainer_wrote = set(metrics)
        if logged:
            metrics.update(logged)
        return metrics

    # ----- self.log ------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, *, on_step: bool | None, on_epoch: bool | None, prog_bar: bool,
            logger: bool, reduce_fx: str, sync_dist: bool, batch_size: int | None) -> None:
        if self.refused:
            raise RuntimeError(f"self.log({name!r}): {self.refused}")
        hook, function = calling_hook()
        rule = HOOKS.get(hook) if hook is not None else None
        if rule is None:
            where = f"{hook}()" if hook is not None else f"{function}(), which is not a hook Lightning logs from,"
            raise RuntimeError(f"self.log({name!r}) called from {where} where values cannot be logged; log from one "
                               f"of: {allowed_hooks()}")
        stage = rule.stage or self.current_stage
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log: the name must be a non-empty string, got {name!r}")
        if reduce_fx not in REDUCE_FX:
            raise ValueError(f"self.log({name!r}, reduce_fx={reduce_fx!r}): the reductions are {list(REDUCE_FX)}")
        for key, flag in (("prog_bar", prog_bar), ("logger", logger), ("sync_dist", sync_dist)):
            if not isinstance(flag, bool):
                raise TypeError(f"self.log({name!r}, {key}={flag!r}): give True or False")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"self.log({name!r}, batch_size={batch_size!r}): give an integer >= 1 (the samples this "
                             "value is a mean over), or None for the batch's real sample count")
        on_step = rule.default_on_step if on_step is None else on_step
        on_epoch = rule.default_on_epoch if on_epoch is None else on_epoch
        for level, given, allowed in (("on_step", on_step, rule.allowed_on_step),
                                      ("on_epoch", on_epoch, rule.allowed_on_epoch)):
            if given not in allowed:
                raise ValueError(f"self.log({name!r}, {level}={given}) in {hook}(): {hook} logs with {level} in "
                                 f"{list(allowed)}")
        if on_step and stage != "train":
            raise ValueError(f"self.log({name!r}, on_step=True) in {hook}(): per-step values exist only in training "
                             "here (an evaluation's batches differ with the number of ranks); give on_step=False (the "
                             f"value is aggregated over the whole {stage} run with on_epoch=True)")
        if not on_step and not on_epoch:
            raise ValueError(f"self.log({name!r}, on_step=False, on_epoch=False) would log nothing; set one of them")
        metric = is_metric(value)
        options = LogOptions(on_step, on_epoch, reduce_fx, sync_dist, prog_bar, logger, metric)
        if name not in self._options.get(stage, {}):
            other = next((s for s, names in self._options.items() if name in names), None)
            if other is not None:  # one name for two things: monitors and callback_metrics would mix them
                raise ValueError(f"self.log({name!r}) in the {stage} stage, but it is logged in the {other} stage too; "
                                 f"give each its own name (e.g. 'train_loss', 'val_loss')")
        known = self._options.setdefault(stage, {}).setdefault(name, options)
        if known != options:
            raise ValueError(f"self.log({name!r}) in the {stage} stage with {options}, but earlier with {known}; "
                             "log one name with the same arguments every time")
        if hook == "on_train_epoch_end" and "train" in self._reduced:  # (a callback's, where it runs after that)
            raise RuntimeError(f"self.log({name!r}) in {hook}() after this training epoch's values were reduced and "
                               "written: nothing would log it with its epoch; log it in the module's "
                               "on_train_epoch_end or in a step")
        if metric:
            self._note_metric(stage, name, value)
        weight = self._weight
        if weight is None and rule.per_batch:
            weight = self._batch_weight
        if weight is not None and weight == 0:
            return  # a padding batch (no real samples): its values do not count
        if batch_size is not None:
            weight = batch_size
        elif weight is None:
            weight = 1  # a hook outside a batch: one value per rank
        if on_step:
            step_value = value
            if metric:
                step_value = forward_value(name, value)
                if step_value is None:
                    raise ValueError(f"self.log({name!r}, <{type(value).__name__}>, on_step=True): the metric has no "
                                     "value for this batch; call the metric object (metric(preds, target)), not only "
                                     "its update(), or log it with on_step=False")
            step_value = _checked_value(name, step_value)
            self.batch_values[name + "_step" if on_epoch else name] = step_value
            if on_epoch:
                self.bare[name] = step_value
            if not self._in_step:  # (a hook between two steps: the next step's)
                self._add(self._pending, name, options, step_value, weight)
            elif self._log_step:  # on other steps it would never be written: not even kept
                self._add(self._step, name, options, step_value, weight)
        if on_epoch:
            scope = self._epochs.setdefault(stage, _Scope())
            if metric:
                scope.values[name] = _Aggregate(options, metric=value)
            else:
                self._add(scope, name, options, _checked_value(name, value), weight)

    def _note_metric(self, stage: str, name: str, metric: Any) -> None:
        """Remember the metric object logged under ``name`` (reset at its stage's epoch end)."""
        known = self._known_metrics.setdefault(name, metric)
        if known is not metric:
            raise ValueError(f"self.log({name!r}, <{type(metric).__name__}>): another metric object was logged under "
                             "this name before; log each metric object under its own name")
        self._metrics.setdefault(stage, {})[name] = metric

    @staticmethod
    def _add(scope: _Scope, name: str, options: LogOptions, value: Any, weight: float) -> None:
        if name not in scope.values:
            scope.values[name] = _Aggregate(options)
        scope.values[name].add(value, weight)

    # ----- reduction --------------------------------------------------------------------------------------
    def _reduce(self, scope: _Scope, strategy: Any, suffix: str, always_agree: bool = False,
                compute: bool = False) -> dict[str, float]:
        """Every name of ``scope`` (and, with sync_dist, of the other ranks' scopes) -> its value.
        ``suffix`` is added when the name is logged both on_step and on_epoch (Lightning's names).
        ``compute``: metric objects give their ``compute()`` (synced by the metric itself, so not
        reduced again); otherwise a metric's values are its forward values, reduced as any value."""
        if self.refused:
            return {}
        synced = {n: a.options for n, a in scope.values.items() if a.options.agreed}
        # Every rank takes part when any rank logged a synced name: a flag first (one tiny all-reduce),
        # then the names. A run that never calls self.log pays that flag on logging steps and evaluation
        # ends only (which make collectives anyway), where it also learns whether any rank has called
        # self.log; at training-epoch ends (no collective may be added there for nothing) the flag runs
        # once some rank is known to log synced values, or this rank does (ranks log alike from their
        # first step; one that starts alone before any logging step would wait for the others until
        # the collective timeout). Unsynced names (sync_dist=False, rank_zero_only) never count.
        logs_synced = self._logs_synced()
        if distributed.is_distributed() and (always_agree or logs_synced or self._anyone_logs):
            flag = torch.tensor([float(bool(synced)), float(logs_synced)], device=self.device)
            anyone_synced, anyone_logs = strategy.all_reduce_max(flag).tolist()  # (the reduction's host read)
            self._anyone_logs = self._anyone_logs or anyone_logs > 0
            if anyone_synced > 0:
                synced = self._agree(synced)
        computed = sorted(n for n, o in synced.items() if compute and o.metric)
        names = sorted(n for n, o in synced.items() if o.sync_dist and not (compute and o.metric))
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        sums, extremes = [], []  # all-reduced with sum / max (a min is the max of negatives)
        for name in names:
            aggregate = scope.values.get(name)
            fx = synced[name].reduce_fx
            total = zero if aggregate is None else zero + aggregate.total  # (a float becomes a tensor)
            if fx == "mean":
                sums += [total, zero + (0.0 if aggregate is None else aggregate.weight)]
            elif fx == "sum":
                sums.append(total)
            elif aggregate is None:
                extremes.append(torch.full((), -torch.inf, dtype=torch.float64, device=self.device))
            else:
                extremes.append(total if fx == "max" else -total)
        results: list[torch.Tensor] = []
        if sums:
            packed = strategy.all_reduce_sum(torch.stack(sums))
            results.append(packed)
        if extremes:
            results.append(strategy.all_reduce_max(torch.stack(extremes)))
        if computed:  # in one order on every rank: each compute() may gather the metric's states
            results.append(torch.stack([compute_value(n, self._metric_for(scope, n)).to(self.device) for n in computed]))
        local = [n for n, a in sorted(scope.values.items()) if not a.options.sync_dist and not (compute and a.options.metric)]
        local_values = []
        for name in local:
            aggregate = scope.values[name]
            total = zero + aggregate.total
            local_values.append(total / max(aggregate.weight, 1e-300) if aggregate.options.reduce_fx == "mean" else total)
        if local_values:
            results.append(torch.stack(local_values))
        flat = torch.cat(results).tolist() if results else []  # the one host read
        out: dict[str, float] = {}
        it = iter(flat)
        sum_values = [next(it) for _ in range(len(sums))]
        extreme_values = [next(it) for _ in range(len(extremes))]
        computed_values = [next(it) for _ in range(len(computed))]
        sum_iter, extreme_iter = iter(sum_values), iter(extreme_values)
        for name in names:
            fx = synced[name].reduce_fx
            if fx == "mean":
                total, weight = next(sum_iter), next(sum_iter)
                value = total / max(weight, 1e-300)
            elif fx == "sum":
                value = next(sum_iter)
            else:
                value = next(extreme_iter) * (1 if fx == "max" else -1)
            out[self._output_name(name, synced[name], suffix)] = value
        for name, value in zip(computed, computed_values):
            out[self._output_name(name, synced[name], suffix)] = value
        for name in local:
            out[self._output_name(name, scope.values[name].options, suffix)] = next(it)
        for name, options in {**{n: a.options for n, a in scope.values.items()}, **synced}.items():
            if options.on_step and options.on_epoch and name + suffix in out:
                self.bare[name] = out[name + suffix]
        return out

    def peek_epoch_metrics(self, stage: str, strategy: Any) -> dict[str, float]:
        """What :meth:`epoch_metrics` would give now, without consuming it: the aggregates and the
        metric objects stay (for ``callback_metrics`` inside ``on_train_epoch_end``, which shows the
        epoch's values in Lightning). A collective where the values are synced."""
        return self._reduce(self._epochs.get(stage, _Scope()), strategy, "_epoch", always_agree=stage != "train",
                            compute=True)

    def _metric_for(self, scope: _Scope, name: str) -> Any:
        """The metric object whose epoch value ``name`` is: this rank's, or (a rank that ran no batch
        of this stage) the object logged under that name earlier in the run."""
        aggregate = scope.values.get(name)
        metric = aggregate.metric if aggregate is not None else self._known_metrics.get(name)
        if metric is None:
            raise RuntimeError(f"self.log({name!r}, <metric>): other ranks logged this metric object, this rank never "
                               "did; log it on every rank")
        return metric

    def _logs_synced(self) -> bool:
        """Whether this rank has logged a synced name in this run."""
        return any(o.agreed for names in self._options.values() for o in names.values())

    def _agree(self, synced: dict[str, LogOptions]) -> dict[str, LogOptions]:
        """The union of the ranks' synced names; one name with other options on two ranks is an error."""
        per_rank = distributed.all_gather_object(synced)
        union: dict[str, LogOptions] = {}
        for rank, names in enumerate(per_rank):
            for name, options in names.items():
                first = union.setdefault(name, options)
                if (first.reduce_fx, first.sync_dist, first.metric) != (options.reduce_fx, options.sync_dist, options.metric):
                    owner = next(r for r, n in enumerate(per_rank) if name in n)
                    raise distributed.MetricKeyMismatch(
                        f"self.log({name!r}): rank {owner} logs it with reduce_fx={first.reduce_fx!r}, rank {rank} "
                        f"with reduce_fx={options.reduce_fx!r}; log one name the same way on every rank"
                    )
        return union

    def _output_name(self, name: str, options: LogOptions, suffix: str) -> str:
        out = name + suffix if options.on_step and options.on_epoch else name
        if options.prog_bar:
            self.prog_bar.add(out)
        if not options.logger:
            self.hidden.add(out)
        return out


def merge_logged(metrics: dict[str, float], logged: dict[str, float] | None, collector: LogCollector) -> dict[str, float]:
    """``metrics`` (the trainer's own) with the ``self.log`` values added; a name the user logs is
    the user's (see :meth:`LogCollector.merge`)."""
    return collector.merge(metrics, logged)
