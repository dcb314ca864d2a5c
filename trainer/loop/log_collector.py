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
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from trainer.runtime import distributed

REDUCE_FX = ("mean", "sum", "max", "min")
#: The step hooks: values logged while a stage runs them go to that stage.
STEP_HOOKS = "training_step, validation_step, test_step, on_before_optimizer_step, on_train_epoch_end"


@dataclass(frozen=True)
class LogOptions:
    """How one name is aggregated and where it goes (``self.log``'s arguments, resolved)."""

    on_step: bool
    on_epoch: bool
    reduce_fx: str
    sync_dist: bool
    prog_bar: bool
    logger: bool


@dataclass
class _Aggregate:
    """One name's running aggregate on this rank: ``total`` (sum of value x weight, sum, max or min:
    a Python float or a device tensor) and ``weight`` (a Python float; mean only)."""

    options: LogOptions
    total: Any = None
    weight: float = 0.0

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


def _caller() -> str:
    """The hook (``on_...`` / ``..._step``) that called ``self.log``, maybe through helpers, else the
    user's function that did (for error messages)."""
    frame = sys._getframe(1)
    ours = (os.path.join("trainer", "module_logging.py"), os.path.join("trainer", "module_log_api.py"))
    while frame is not None and frame.f_code.co_filename.endswith(ours):
        frame = frame.f_back
    user = frame.f_code.co_name if frame is not None else "?"
    while frame is not None and not frame.f_code.co_filename.endswith(os.path.join("trainer", "loop.py")):
        if frame.f_code.co_name.startswith("on_") or frame.f_code.co_name.endswith("_step"):
            return frame.f_code.co_name
        frame = frame.f_back
    return user


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
    raise TypeError(f"self.log({name!r}, ...): the value is a {type(value).__name__}; log a Python number or a "
                    "one-element tensor (a metric object: log its computed value)")


class LogCollector:
    """Collects what a module logs during a run and reduces it (see the module docstring).

    The loop drives it: :meth:`stage` (or :meth:`begin` / :meth:`end`) around a stage,
    :meth:`micro_batch` around each step call, :meth:`begin_step` / :meth:`end_step` around an
    optimizer step, :meth:`epoch_end_hooks` around an epoch-end hook and :meth:`epoch_metrics`
    at the end of an epoch or evaluation run. An evaluation stage (validation, test) is::

        with run.module_logs.stage("test"):
            for index, (weight, batch) in ...:          # weight: the batch's real samples (0: padding)
                with run.module_logs.micro_batch(weight):
                    output = module.test_step(batch, index)
            # hooks that may log epoch values (e.g. an on_test_epoch_end) go here, inside the stage
        logged = run.module_logs.epoch_metrics("test", run.strategy)   # on every rank: collectives
    """

    def __init__(self, device: torch.device, refused: str | None = None):
        self.device = device
        self.refused = refused  # why self.log cannot work in this run (e.g. under the pipeline), or None
        self._stages: list[str | None] = [None]  # the innermost last; None: no stage runs
        self._weight: float | None = None  # the current micro-batch's weight; None: a hook
        self._in_step = False  # between begin_step and end_step (training)
        self._log_step = False  # this optimizer step is a logging step
        self._epoch_end = False  # in an epoch-end hook (on_epoch only)
        self._step = _Scope()
        self._epochs: dict[str, _Scope] = {}
        self._options: dict[str, dict[str, LogOptions]] = {}  # stage -> name -> options (first call's)
        #: output names the progress bar shows (``prog_bar=True``) and names kept off the loggers
        self.prog_bar: set[str] = set()
        self.hidden: set[str] = set()
        self._anyone_logs = False  # some rank has logged a synced name (learnt at reductions)

    # ----- where the run is (called by the loop) ---------------------------------------------------
    @property
    def current_stage(self) -> str | None:
        return self._stages[-1]

    def begin(self, stage: str) -> None:
        """Enter ``stage`` ("train", "validate", "test", ...): its epoch aggregates start empty."""
        self._stages.append(stage)
        self._epochs[stage] = _Scope()

    def end(self) -> None:
        """Leave the current stage (back to the one it interrupted, e.g. training after a validation)."""
        self._stages.pop()
        self._weight = None

    @contextlib.contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        self.begin(stage)
        try:
            yield
        finally:
            self.end()

    @contextlib.contextmanager
    def micro_batch(self, weight: int | float) -> Iterator[None]:
        """Around one step call: values logged inside weigh ``weight`` (the batch's real samples;
        0 for a padding batch, whose values are not counted)."""
        self._weight = weight
        try:
            yield
        finally:
            self._weight = None

    def begin_step(self, log_now: bool) -> None:
        """An optimizer step starts (training); ``log_now``: it is a logging step."""
        self._in_step, self._log_step, self._step = True, log_now, _Scope()

    def end_step(self, strategy: Any) -> dict[str, float] | None:
        """The step's ``on_step`` values, reduced (logging steps; on every rank), or None."""
        self._in_step = False
        if not self._log_step:
            return None
        return self._reduce(self._step, strategy, "_step", always_agree=True)

    @contextlib.contextmanager
    def epoch_end_hooks(self) -> Iterator[None]:
        """Around ``on_train_epoch_end``: values logged there are epoch values (on_epoch)."""
        self._epoch_end = True
        try:
            yield
        finally:
            self._epoch_end = False

    def epoch_metrics(self, stage: str, strategy: Any) -> dict[str, float]:
        """The ``on_epoch`` values of ``stage`` since it began (or since its last epoch), reduced
        over the ranks (on every rank); the aggregates start again empty."""
        scope = self._epochs.get(stage, _Scope())
        self._epochs[stage] = _Scope()
        return self._reduce(scope, strategy, "_epoch", always_agree=stage != "train")

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

    # ----- self.log ------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, *, on_step: bool | None, on_epoch: bool | None, prog_bar: bool,
            logger: bool, reduce_fx: str, sync_dist: bool, batch_size: int | None) -> None:
        if self.refused:
            raise RuntimeError(f"self.log({name!r}): {self.refused}")
        stage = self.current_stage
        if stage is None or (stage == "train" and not self._in_step and not self._epoch_end):
            raise RuntimeError(f"self.log({name!r}) called from {_caller()}(), where nothing collects it: log from "
                               f"{STEP_HOOKS} (values logged elsewhere, e.g. in on_validation_end or "
                               "on_train_step_end, would come after their metrics were reduced)")
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
        train_step = stage == "train" and not self._epoch_end
        on_step = train_step if on_step is None else on_step
        on_epoch = (not train_step) if on_epoch is None else on_epoch
        if on_step and not train_step:
            where = "on_train_epoch_end" if stage == "train" else f"the {stage} stage"
            raise ValueError(f"self.log({name!r}, on_step=True) in {where}: per-step values exist only in training "
                             "steps here; give on_step=False (the value is aggregated over the whole "
                             f"{'epoch' if stage == 'train' else stage + ' run'} with on_epoch=True)")
        if not on_step and not on_epoch:
            raise ValueError(f"self.log({name!r}, on_step=False, on_epoch=False) would log nothing; set one of them")
        options = LogOptions(on_step, on_epoch, reduce_fx, sync_dist, prog_bar, logger)
        if name not in self._options.get(stage, {}):
            other = next((s for s, names in self._options.items() if name in names), None)
            if other is not None:  # one name for two things: monitors and callback_metrics would mix them
                raise ValueError(f"self.log({name!r}) in the {stage} stage, but it is logged in the {other} stage too; "
                                 f"give each its own name (e.g. 'train_loss', 'val_loss')")
        known = self._options.setdefault(stage, {}).setdefault(name, options)
        if known != options:
            raise ValueError(f"self.log({name!r}) in the {stage} stage with {options}, but earlier with {known}; "
                             "log one name with the same arguments every time")
        value = _checked_value(name, value)
        weight = self._weight
        if weight is not None and weight == 0:
            return  # a padding batch (no real samples): its values do not count
        if batch_size is not None:
            weight = batch_size
        elif weight is None:
            weight = 1  # a hook outside a batch: one value per rank
        if on_step and self._log_step:  # on other steps it would never be written: not even kept
            self._add(self._step, name, options, value, weight)
        if on_epoch:
            self._add(self._epochs.setdefault(stage, _Scope()), name, options, value, weight)

    @staticmethod
    def _add(scope: _Scope, name: str, options: LogOptions, value: Any, weight: float) -> None:
        if name not in scope.values:
            scope.values[name] = _Aggregate(options)
        scope.values[name].add(value, weight)

    # ----- reduction --------------------------------------------------------------------------------------
    def _reduce(self, scope: _Scope, strategy: Any, suffix: str, always_agree: bool = False) -> dict[str, float]:
        """Every name of ``scope`` (and, with sync_dist, of the other ranks' scopes) -> its value.
        ``suffix`` is added when the name is logged both on_step and on_epoch (Lightning's names)."""
        if self.refused:
            return {}
        synced = {n: a.options for n, a in scope.values.items() if a.options.sync_dist}
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
        names = sorted(synced)
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
        local = [n for n, a in sorted(scope.values.items()) if not a.options.sync_dist]
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
        for name in local:
            out[self._output_name(name, scope.values[name].options, suffix)] = next(it)
        return out

    def _logs_synced(self) -> bool:
        """Whether this rank has logged a synced name in this run."""
        return any(o.sync_dist for names in self._options.values() for o in names.values())

    def _agree(self, synced: dict[str, LogOptions]) -> dict[str, LogOptions]:
        """The union of the ranks' synced names; one name with other options on two ranks is an error."""
        per_rank = distributed.all_gather_object(synced)
        union: dict[str, LogOptions] = {}
        for rank, names in enumerate(per_rank):
            for name, options in names.items():
                first = union.setdefault(name, options)
                if (first.reduce_fx, first.sync_dist) != (options.reduce_fx, options.sync_dist):
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


def merge_logged(metrics: dict[str, float], logged: dict[str, float] | None, where: str) -> dict[str, float]:
    """``metrics`` with the ``self.log`` values added; a name the trainer already reports is an error."""
    if logged:
        clash = sorted(set(metrics) & set(logged))
        if clash:
            raise ValueError(f"self.log names {clash} clash with the {where} metrics the trainer reports under the "
                             "same names (returned from the step or its own); log them under other names")
        metrics.update(logged)
    return metrics
