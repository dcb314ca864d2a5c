"""``self.log`` / ``self.log_dict``: values a module logs from its steps and hooks (Lightning's API),
collected on this rank.

The loop owns one `LogCollector` per run and tells it where the run is: which stage
(``"train"``, ``"validate"``, or any other stage string such as ``"test"``), which micro-batch and
its weight (real samples), and whether this optimizer step is a logging step. ``TrainModule.log``
hands each value to it.

Values stay on their device: per micro-batch the collector only adds ``value * weight`` (mean),
``value`` (sum) or a running max / min into device tensors (``log_aggregates.py``). An ``on_step``
value is not even looked at on a step that is not a logging step (it would never be written). The
reduction across ranks, one host read and a few collectives, happens on logging steps (``on_step``
values), at training-epoch ends and at the end of each evaluation run (``on_epoch`` values):
``log_reduction.py``, the collector's base class.

A torchmetrics object logged as a value: its forward value of the batch is a step value (reduced as
any value); its epoch value is ``compute()`` (see ``log_reduction.py``). A batch that counts for
nothing (padding) leaves the module's metric objects as they were.

Names: a name the user logs is the user's. Where the trainer reports a value under the same name
(``train/loss``, ``val/loss``, ...), the user's value is the one written and the trainer's is not.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from trainer.api.errors import MisconfigurationException
from trainer.loop.log_aggregates import REDUCE_FX, Aggregate, LogOptions, Scope, checked_value
from trainer.loop.log_hooks import HOOKS, allowed_hooks, calling_hook
from trainer.loop.log_reduction import LogReduction, suffixed
from trainer.runtime.metric_objects import MetricStates, forward_value, is_metric, module_metrics



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


class LogCollector(LogReduction):
    """Collects what a module logs during a run and reduces it (`LogReduction`; see the module docstring).

    The loop drives it: `stage` (or `begin` / `end`) around a stage,
    `micro_batch` around each step call, `begin_step` / `end_step` around an
    optimizer step, and `epoch_metrics` at the end of an epoch or evaluation run
    (`discard` after a pass whose values are not logged: the sanity check). Which stage and
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
        self._step = Scope()
        self._pending = Scope()  # on_step values logged between two steps: the next step's
        self._eval_step = Scope()  # on_step values of the current evaluation batch
        self._dataloader_suffix = ""  # "/dataloader_idx_N" while one of several loaders runs
        self._epochs: dict[str, Scope] = {}
        self._options: dict[str, dict[str, LogOptions]] = {}  # stage -> name -> options (first call's)
        #: stage -> name -> options of the name logged again at the other level only (e.g. on_step in
        #: training_step, on_epoch in on_train_epoch_end: Lightning keeps both; each has its own aggregate)
        self._other_level: dict[str, dict[str, LogOptions]] = {}
        self._option_hooks: dict[tuple[str, str], str] = {}  # (stage, name) -> the hook of its first call
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
        #: every name the trainer itself wrote in this run (throughput, memory, losses it reduced); not the user's
        self.own_names: set[str] = set()
        #: with several evaluation loaders: name -> the loader whose batches logged it (one loader only)
        self.loader_of: dict[str, int] = {}
        self._shared_names: set[str] = set()  # names logged in the batches of two loaders
        self._dataloader_idx: int | None = None
        self._reduced: set[str] = set()  # stages whose epoch values were reduced since their last step

    # ----- where the run is (called by the loop) ---------------------------------------------------
    @property
    def current_stage(self) -> str | None:
        return self._stages[-1]

    def begin(self, stage: str) -> None:
        """Enter ``stage`` ("train", "validate", "test", ...). Its epoch aggregates hold what a start
        hook logged before (e.g. ``on_train_start``); each epoch's reduction empties them."""
        self._stages.append(stage)
        self._epochs.setdefault(stage, Scope())

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
            self._step, self._pending = self._pending, Scope()
        else:
            if self._step.values:
                self._step = Scope()
            if self._pending.values:
                self._pending = Scope()

    def end_step(self, strategy: Any) -> dict[str, float] | None:
        """The step's ``on_step`` values, reduced (logging steps; on every rank), or None."""
        self._in_step = False
        self._batch_weight = None
        if not self._log_step:
            return None
        reduced = self._reduce(self._step, strategy, "_step", always_agree=True)
        self.batch_values.clear()  # the reduced values take over
        return reduced

    def drop_step(self) -> None:
        """An optimizer step abandoned before its end (``on_train_batch_start`` returned -1): its
        ``on_step`` values are dropped; ``on_epoch`` values its micro-batches logged stay."""
        self._in_step = False
        self._batch_weight = None
        self._step = Scope()

    def peek_step_metrics(self, strategy: Any) -> None:
        """On a logging step, before the step's last ``on_train_batch_end``: the step's values so far,
        reduced, shown in ``callback_metrics`` (as Lightning's, synced when read there); `end_step`
        reduces them again with what that hook logs. A collective on logging steps only."""
        if self._log_step:
            self.batch_values.update(self._reduce(self._step, strategy, "_step", always_agree=True))

    @contextlib.contextmanager
    def epoch_end_hooks(self) -> Iterator[None]:
        """Around ``on_train_epoch_end`` (values logged there are epoch values: its row in the hooks' table)."""
        yield

    def known_names(self) -> set[str]:
        """Every metric name ``self.log`` calls of this run produce (in any stage, logged or not yet)."""
        names = set()
        for options_by_name in self._options.values():
            for name, options in options_by_name.items():
                both = options.on_step and options.on_epoch
                names.update((name + "_step", name + "_epoch") if both else (name,))
        return names

    def prog_bar_names(self) -> frozenset[str]:
        """The output names of the values logged with ``prog_bar=True`` (now or earlier in this run)."""
        names = set(self.prog_bar)
        for options_by_name in self._options.values():
            for name, options in options_by_name.items():
                if options.prog_bar:
                    both = options.on_step and options.on_epoch
                    names.update((suffixed(name, "_step"), suffixed(name, "_epoch")) if both else (name,))
        return frozenset(names)

    def merge(self, metrics: dict[str, float], logged: dict[str, float] | None) -> dict[str, float]:
        """The trainer's ``metrics`` with the ``self.log`` values added. A name the user logs (now or
        at any time in this run) is the user's: the trainer's value under that name is not written
        (it stays in `shadowed`, e.g. for the progress bar)."""
        user = self.known_names()
        self.shadowed.clear()  # (in place: the progress bar holds it)
        self.shadowed.update({name: metrics.pop(name) for name in list(metrics) if name in user})
        if self.current_stage == "train":  # (a training step's merge)
            self._trainer_wrote = set(metrics)
        if not metrics.keys() <= self.own_names:
            self.own_names.update(metrics)
        if logged:
            metrics.update(logged)
        return metrics

    # ----- self.log ------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, *, on_step: bool | None, on_epoch: bool | None, prog_bar: bool,
            logger: bool, reduce_fx: str, sync_dist: bool, batch_size: int | None,
            add_dataloader_idx: bool = True) -> None:
        if self.refused:
            raise RuntimeError(f"self.log({name!r}): {self.refused}")
        hook, function = calling_hook()
        if self._dataloader_suffix and hook is not None and (hook.endswith("_step") or "_batch_" in hook) and \
                isinstance(name, str):
            if add_dataloader_idx:
                name += self._dataloader_suffix  # one of several loaders (Lightning's names)
            self._note_loader(name)
        rule = HOOKS.get(hook) if hook is not None else None
        if rule is None:
            where = f"{hook}()" if hook is not None else f"{function}(), which is not a hook Lightning logs from,"
            raise RuntimeError(f"self.log({name!r}) called from {where} where values cannot be logged; log from one "
                               f"of: {allowed_hooks()}")
        stage = rule.stage or self.current_stage
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log: the name must be a non-empty string, got {name!r}")
        if reduce_fx not in REDUCE_FX:
            raise MisconfigurationException(f"self.log({name!r}, reduce_fx={reduce_fx!r}): only `self.log(..., "
                                            f"reduce_fx={{min,max,mean,sum}})` are supported: the reductions are "
                                            f"{list(REDUCE_FX)}")
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
        if not on_step and not on_epoch:
            raise MisconfigurationException(f"self.log({name!r}, on_step=False, on_epoch=False) is not useful: it "
                                            "would log nothing; set one of them")
        metric = is_metric(value)
        options = LogOptions(on_step, on_epoch, reduce_fx, sync_dist, prog_bar, logger, metric)
        if name not in self._options.get(stage, {}):
            other = next((s for s, names in self._options.items() if name in names), None)
            if other is not None:  # one name for two things: monitors and callback_metrics would mix them
                raise ValueError(f"self.log({name!r}) in the {stage} stage, but it is logged in the {other} stage too; "
                                 f"give each its own name (e.g. 'train_loss', 'val_loss')")
        known = self._options.setdefault(stage, {}).setdefault(name, options)
        if known != options and _other_level(known, options):  # (Lightning's: one aggregate per level)
            known = self._other_level.setdefault(stage, {}).setdefault(name, options)
        first_hook = self._option_hooks.setdefault((stage, name), hook)
        if known != options:
            where = f"twice in `{hook}`" if first_hook == hook else f"in `{hook}` and before in `{first_hook}`"
            raise MisconfigurationException(
                f"You called `self.log({name}, ...)` {where} with different arguments ({options} now, {known} "
                f"before); log one name with the same arguments every time in the {stage} stage")
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
            step_value = checked_value(name, step_value)
            if stage != "train":  # an evaluation batch's value: reduced over the ranks after the batch
                self._add(self._eval_step, name, options, step_value, weight)
            else:
                self._add_train_step(name, options, step_value, weight)
        if on_epoch:
            self._add_epoch(stage, name, options, value, metric, weight)

    def _add_train_step(self, name: str, options: LogOptions, step_value: Any, weight: float) -> None:
        self.batch_values[name + "_step" if options.on_epoch else name] = step_value
        if options.on_epoch:
            self.bare[name] = step_value
        if not self._in_step:  # (a hook between two steps: the next step's)
            self._add(self._pending, name, options, step_value, weight)
        elif self._log_step:  # on other steps it would never be written: not even kept
            self._add(self._step, name, options, step_value, weight)

    def _add_epoch(self, stage: str, name: str, options: LogOptions, value: Any, metric: bool, weight: float) -> None:
        scope = self._epochs.setdefault(stage, Scope())
        if metric:
            scope.values[name] = Aggregate(options, metric=value)
        else:
            self._add(scope, name, options, checked_value(name, value), weight)

    # ----- evaluation batches' on_step values ----------------------------------------------------------
    def logs_eval_steps(self, stage: str) -> bool:
        """Whether ``self.log(..., on_step=True)`` was called in evaluation ``stage`` (on this rank)."""
        return any(options.on_step for options in self._options.get(stage, {}).values())

    def eval_step_metrics(self, strategy: Any) -> dict[str, float]:
        """The ``on_step`` values of the evaluation batch just run, reduced over the ranks (every rank
        calls it once per batch position, a rank without a batch there with nothing of its own)."""
        scope, self._eval_step = self._eval_step, Scope()
        return self._reduce(scope, strategy, "_step", always_agree=True)

    def use_dataloader(self, dataloader_idx: int | None) -> None:
        """The evaluation loader that runs now (None: the stage's only one; names are kept as given)."""
        self._dataloader_suffix = "" if dataloader_idx is None else f"/dataloader_idx_{dataloader_idx}"
        self._dataloader_idx = dataloader_idx

    def _note_loader(self, name: str) -> None:
        """``name`` was logged in a batch of the current loader (of several): it belongs to that loader's
        results (Lightning's per-loader dicts), unless another loader's batches log it too."""
        owner = self.loader_of.setdefault(name, self._dataloader_idx)
        if owner != self._dataloader_idx or name in self._shared_names:
            self._shared_names.add(name)
            self.loader_of.pop(name, None)

    def discard_eval_step(self) -> None:
        self._eval_step = Scope()

    def _note_metric(self, stage: str, name: str, metric: Any) -> None:
        """Remember the metric object logged under ``name`` (reset at its stage's epoch end)."""
        known = self._known_metrics.setdefault(name, metric)
        if known is not metric:
            raise ValueError(f"self.log({name!r}, <{type(metric).__name__}>): another metric object was logged under "
                             "this name before; log each metric object under its own name")
        self._metrics.setdefault(stage, {})[name] = metric

    @staticmethod
    def _add(scope: Scope, name: str, options: LogOptions, value: Any, weight: float) -> None:
        if name not in scope.values:
            scope.values[name] = Aggregate(options)
        scope.values[name].add(value, weight)


def _other_level(known: LogOptions, options: LogOptions) -> bool:
    """Whether two calls log one name at different levels only (one on_step, the other on_epoch)."""
    return {(known.on_step, known.on_epoch), (options.on_step, options.on_epoch)} == {(True, False), (False, True)}


def merge_logged(metrics: dict[str, float], logged: dict[str, float] | None, collector: LogCollector) -> dict[str, float]:
    """``metrics`` (the trainer's own) with the ``self.log`` values added; a name the user logs is
    the user's (see `LogCollector.merge`)."""
    return collector.merge(metrics, logged)
