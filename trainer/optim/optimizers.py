"""What ``TrainModule.configure_optimizers`` may return, read into (optimizer, scheduler configs).

Lightning's single-optimizer shapes are accepted (see ``ACCEPTED``); anything else is an error that
lists them. Several optimizers (``ACCEPTED_SEVERAL``) need manual optimization
(``automatic_optimization = False``, as in Lightning >= 2.0); their schedulers are then stepped by the
module (trainer/loop/manual_step.py).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.api.errors import MisconfigurationException
from trainer.runtime import distributed
from trainer.optim.lr_scheduling import INTERVALS, LRSchedulerConfig
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)

ACCEPTED = (
    "configure_optimizers may return: an optimizer; (optimizer, scheduler); [optimizer]; "
    "([optimizer], [scheduler, ...]); {'optimizer': optimizer, 'lr_scheduler': scheduler, 'monitor': ...} "
    "(or [that dict]). A scheduler is a torch LRScheduler / ReduceLROnPlateau (another class with state_dict / "
    "load_state_dict where the module overrides lr_scheduler_step) or a dict "
    "{'scheduler': ..., 'interval': 'step'|'epoch', 'frequency': n, 'monitor': 'val/...'|'train/...'|a self.log name, "
    "'strict': bool, 'name': str, 'reduce_on_plateau': bool}"
)
ACCEPTED_SEVERAL = (
    "with automatic_optimization = False also: [optimizer, ...]; ([optimizer, ...], [scheduler, ...]); "
    "[{'optimizer': optimizer, 'lr_scheduler': scheduler}, ...]; a scheduler is any object with state_dict / "
    "load_state_dict and an .optimizer that is one of the optimizers (a torch LRScheduler / ReduceLROnPlateau, or "
    "a class of your own), or {'scheduler': ..., 'name': str} (the module steps it)"
)
MANUAL_SCHEDULER_KEYS = ("scheduler", "name")
#: scheduler dict keys accepted under manual optimization but not used there (one warning names them)
MANUAL_UNUSED_SCHEDULER_KEYS = ("interval", "frequency", "monitor", "strict", "reduce_on_plateau")
#: of those, the ones dropped (a RuntimeWarning names them, as Lightning's); interval / frequency are kept
MANUAL_IGNORED_SCHEDULER_KEYS = ("reduce_on_plateau", "monitor", "strict")
OPTIMIZER_DICT_KEYS = ("optimizer", "lr_scheduler", "monitor")
SCHEDULER_DICT_KEYS = ("scheduler", "name", "interval", "frequency", "reduce_on_plateau", "monitor", "strict")


class _UseRecorder:
    """A factory given to ``TrainModule.__init__``, recording that ``configure_optimizers`` used it
    (called it or read an attribute of it, e.g. a partial's ``keywords``)."""

    def __init__(self, factory: Any, used: set, name: str):
        self._factory, self._used, self._name = factory, used, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._used.add(self._name)
        return self._factory(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:
        self._used.add(self._name)
        return getattr(self._factory, attribute)


def configure_optimizers(module: Any, steps_schedulers: bool = False) -> tuple[Any, list[LRSchedulerConfig]]:
    """``module.configure_optimizers()`` read by ``split_optimizers`` (under manual optimization:
    ``split_manual``, which returns a list of optimizers); ``steps_schedulers``: the module overrides
    ``lr_scheduler_step`` (then a scheduler of any class is accepted). An ``optimizer=`` or ``scheduler=``
    factory the module was given (the Hydra ``optimizer`` / ``scheduler`` groups) that an overriding
    ``configure_optimizers`` never used is an error: its settings (``optimizer.lr=...``) would be ignored."""
    used: set = set()
    given = {name: getattr(module, f"{name}_factory", None) for name in ("optimizer", "scheduler")}
    for name, factory in given.items():
        if factory is not None:
            setattr(module, f"{name}_factory", _UseRecorder(factory, used, name))
    try:
        configured = module.configure_optimizers()
    finally:
        for name, factory in given.items():
            setattr(module, f"{name}_factory", factory)
    unused = [name for name, factory in given.items() if factory is not None and name not in used]
    if unused:
        raise ValueError(
            f"{type(module).__name__} was given {' and '.join(n + '=' + _describe_factory(given[n]) for n in unused)} "
            f"(the {' / '.join(unused)} config group{'s' if len(unused) > 1 else ''}), but its configure_optimizers() "
            f"does not use {'them' if len(unused) > 1 else 'it'}, so those settings would be ignored: build from "
            f"{' / '.join('self.' + n + '_factory' for n in unused)}, or do not pass {' / '.join(n + '=' for n in unused)} "
            f"(a recipe: remove {' / '.join(n + ': ${' + n + '}' for n in unused)} from its module node)"
        )
    automatic = getattr(module, "automatic_optimization", True)
    if not isinstance(automatic, bool):
        raise TypeError(f"{type(module).__name__}.automatic_optimization={automatic!r}; it must be True or False")
    if not automatic:
        return split_manual(configured)
    _refuse_optimizer_idx(module)
    interval = getattr(module, "scheduler_interval", "step")
    if interval not in INTERVALS:
        raise ValueError(f"{type(module).__name__}.scheduler_interval={interval!r}; the intervals are {list(INTERVALS)}")
    return split_optimizers(configured, default_interval=interval, steps_schedulers=steps_schedulers)


def _describe_factory(factory: Any) -> str:
    func = getattr(factory, "func", factory)
    keywords = getattr(factory, "keywords", {}) or {}
    name = getattr(func, "__qualname__", type(func).__name__)
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in keywords.items())})"


def split_optimizers(configured: Any, default_interval: str = "step", steps_schedulers: bool = False
                     ) -> tuple[torch.optim.Optimizer, list[LRSchedulerConfig]]:
    """``(optimizer, scheduler configs)`` from what ``configure_optimizers`` returned; a scheduler
    without an ``interval`` steps every ``default_interval``; ``steps_schedulers``: the module's
    ``lr_scheduler_step`` steps them (a scheduler need not be torch's)."""
    monitor = None
    if _is_optimizer(configured):
        optimizer, schedulers = configured, []
    elif isinstance(configured, dict):
        optimizer, schedulers, monitor = _read_optimizer_dict(configured)
    elif isinstance(configured, (list, tuple)) and configured and all(isinstance(o, dict) for o in configured):
        _refuse_several([d.get("optimizer") for d in configured])
        optimizer, schedulers, monitor = _read_optimizer_dict(configured[0])
    elif isinstance(configured, (list, tuple)) and configured and all(_is_optimizer(o) for o in configured):
        _refuse_several(configured)
        optimizer, schedulers = configured[0], []
    elif (isinstance(configured, (list, tuple)) and len(configured) == 2
          and all(isinstance(part, (list, tuple)) for part in configured)):
        optimizers, schedulers = configured
        _refuse_several(optimizers)
        if len(optimizers) != 1:
            raise TypeError(f"configure_optimizers returned ([], ...): no optimizer. {ACCEPTED}")
        optimizer, schedulers = optimizers[0], list(schedulers)
    elif isinstance(configured, (list, tuple)) and len(configured) == 2:  # (optimizer, scheduler), types checked below
        optimizer, schedulers = configured[0], [] if configured[1] is None else [configured[1]]
    else:
        raise TypeError(f"configure_optimizers returned {_describe(configured)}. {ACCEPTED}")
    if not _is_optimizer(optimizer):
        raise TypeError(f"configure_optimizers gave optimizer={_describe(optimizer)}, not a torch.optim.Optimizer. {ACCEPTED}")
    configs = [_read_scheduler(s, optimizer, monitor, default_interval, steps_schedulers) for s in schedulers]
    names = [c.name for c in configs if c.name is not None]
    if len(set(names)) != len(names):
        raise ValueError(f"configure_optimizers: lr_scheduler names {names} repeat; give each scheduler its own name")
    return optimizer, configs


def _is_optimizer(value: Any) -> bool:
    return isinstance(value, torch.optim.Optimizer)


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value)
        return f"({inner},)" if isinstance(value, tuple) and len(value) == 1 else (
            f"({inner})" if isinstance(value, tuple) else f"[{inner}]")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)
    name = type(value).__name__
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"


class SeveralOptimizersError(TypeError, RuntimeError):
    """Several optimizers (or ``training_step(..., optimizer_idx)``) under automatic optimization: a
    TypeError as this trainer's other shape errors, a RuntimeError as Lightning's."""


def _refuse_optimizer_idx(module: Any) -> None:
    """Lightning 1.x's ``training_step(batch, batch_idx, optimizer_idx)`` under automatic optimization:
    refused when fit starts (the step would never be given the argument)."""
    try:
        parameters = inspect.signature(module.training_step).parameters
    except (TypeError, ValueError):
        return
    if "optimizer_idx" in parameters:
        raise SeveralOptimizersError(
            f"{type(module).__name__}.training_step takes optimizer_idx: training with multiple optimizers is only "
            "supported with manual optimization. Remove the `optimizer_idx` argument from `training_step`, set "
            "self.automatic_optimization = False in __init__ and step the optimizers of self.optimizers() in "
            "training_step")


def _refuse_several(optimizers: Any) -> None:
    if isinstance(optimizers, (list, tuple)) and len(optimizers) > 1:
        raise SeveralOptimizersError(
            f"configure_optimizers returned {len(optimizers)} optimizers ({_describe(list(optimizers))}) with "
            "automatic optimization (training with multiple optimizers is only supported with manual optimization; "
            "automatic steps one, as Lightning >= 2.0): set self.automatic_optimization = False "
            "in the module's __init__ and step them in training_step (self.optimizers(), self.manual_backward(loss)), "
            f"or return one optimizer over all parameters (with parameter groups if needed). {ACCEPTED}"
        )


def split_manual(configured: Any) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
    """Manual optimization: ``([optimizers], scheduler configs)`` from any shape of ``ACCEPTED`` or
    ``ACCEPTED_SEVERAL``. The module steps the schedulers, so a scheduler dict takes only 'scheduler'
    and 'name' (when to step is the module's code)."""
    shapes = f"{ACCEPTED}; {ACCEPTED_SEVERAL}"
    if _is_optimizer(configured):
        optimizers, schedulers = [configured], []
    elif isinstance(configured, dict):
        optimizers, schedulers = _read_manual_dict(configured, shapes)
    elif isinstance(configured, (list, tuple)) and configured and all(isinstance(o, dict) for o in configured):
        optimizers, schedulers = [], []
        for entry in configured:
            more, scheduler = _read_manual_dict(entry, shapes)
            optimizers += more
            schedulers += scheduler
    elif isinstance(configured, (list, tuple)) and configured and all(_is_optimizer(o) for o in configured):
        optimizers, schedulers = list(configured), []
    elif (isinstance(configured, (list, tuple)) and len(configured) == 2
          and all(isinstance(part, (list, tuple)) for part in configured)):
        optimizers, schedulers = list(configured[0]), list(configured[1])
    elif isinstance(configured, (list, tuple)) and len(configured) == 2 and _is_optimizer(configured[0]):
        optimizers, schedulers = [configured[0]], [] if configured[1] is None else [configured[1]]
    else:
        raise TypeError(f"configure_optimizers returned {_describe(configured)}. {shapes}")
    if not optimizers or not all(_is_optimizer(o) for o in optimizers):
        raise TypeError(f"configure_optimizers gave optimizers {_describe(optimizers)}: each must be a "
                        f"torch.optim.Optimizer, at least one. {shapes}")
    configs = [_read_manual_scheduler(s, optimizers) for s in schedulers]
    names = [c.name for c in configs if c.name is not None]
    if len(set(names)) != len(names):
        raise ValueError(f"configure_optimizers: lr_scheduler names {names} repeat; give each scheduler its own name")
    return optimizers, configs


def _read_manual_dict(configured: dict, shapes: str) -> tuple[list, list]:
    unknown = sorted(set(configured) - {"optimizer", "lr_scheduler"}, key=str)
    if unknown:
        raise ValueError(f"configure_optimizers dict: keys {unknown} with manual optimization, where the module steps "
                         "its schedulers itself (e.g. with a metric for ReduceLROnPlateau); the keys are "
                         f"['optimizer', 'lr_scheduler']")
    if "optimizer" not in configured:
        raise ValueError(f"configure_optimizers dict has no 'optimizer' key. {shapes}")
    scheduler = configured.get("lr_scheduler")
    return [configured["optimizer"]], [] if scheduler is None else [scheduler]


def _read_manual_scheduler(given: Any, optimizers: list) -> LRSchedulerConfig:
    options = dict(given) if isinstance(given, dict) else {"scheduler": given}
    ignored = [key for key in options if key in MANUAL_IGNORED_SCHEDULER_KEYS]
    if ignored and distributed.rank() == 0:  # (a Python warning, as Lightning's; once, by rank 0)
        warnings.warn(f"lr_scheduler dict under manual optimization has the key(s) {ignored}, but the keys will be "
                      "ignored: the module steps its schedulers itself (self.lr_schedulers(), e.g. "
                      "scheduler.step(metric) for ReduceLROnPlateau)", RuntimeWarning, stacklevel=2)
    kept = sorted(set(options) & {"interval", "frequency"}, key=str)
    if kept:  # (Lightning keeps them silently)
        rank_zero_warn(log, "lr_scheduler dict: keys %s do not step the scheduler under manual optimization (the "
                       "module steps it itself, self.lr_schedulers()); they are kept for LearningRateMonitor", kept)
    unknown = sorted(set(options) - set(MANUAL_SCHEDULER_KEYS) - set(MANUAL_UNUSED_SCHEDULER_KEYS), key=str)
    if unknown:
        raise ValueError(f"lr_scheduler dict: keys {unknown} with manual optimization: the module steps its schedulers "
                         f"itself (self.lr_schedulers()), so when to step is its code; the keys are "
                         f"{list(MANUAL_SCHEDULER_KEYS)}")
    scheduler, name = options.get("scheduler"), options.get("name")
    _require_state(scheduler, ACCEPTED_SEVERAL)  # (any class: the module steps it; checkpoints keep its state)
    if not hasattr(scheduler, "optimizer"):
        raise ValueError(f"lr_scheduler {type(scheduler).__name__} has no .optimizer attribute: a scheduler names the "
                         "optimizer it schedules (one that configure_optimizers returned) in .optimizer")
    if not any(scheduler.optimizer is o for o in optimizers):
        raise ValueError(f"lr_scheduler {type(scheduler).__name__} was built on an optimizer that configure_optimizers "
                         "did not return; build it on one of them")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"lr_scheduler dict: name={name!r}; it must be a non-empty string or None")
    # Never stepped by the trainer (its interval is not used); kept for checkpoints and LearningRateMonitor.
    interval, frequency = options.get("interval", "step"), options.get("frequency", 1)
    if interval not in INTERVALS or isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"lr_scheduler dict: interval={interval!r}, frequency={frequency!r}; the intervals are "
                         f"{list(INTERVALS)}, the frequency an integer >= 1")
    return LRSchedulerConfig(scheduler, name=name, interval=interval, frequency=frequency)


def _read_optimizer_dict(configured: dict) -> tuple[Any, list, Any]:
    unknown = sorted(set(configured) - set(OPTIMIZER_DICT_KEYS), key=str)
    if unknown:
        raise ValueError(f"configure_optimizers dict: unknown keys {unknown}; the keys are {list(OPTIMIZER_DICT_KEYS)}")
    if "optimizer" not in configured:
        raise ValueError(f"configure_optimizers dict has no 'optimizer' key. {ACCEPTED}")
    scheduler = configured.get("lr_scheduler")
    if isinstance(scheduler, (list, tuple)):
        raise TypeError(f"configure_optimizers dict: 'lr_scheduler' is {_describe(scheduler)}; give one scheduler or "
                        "scheduler dict there (several: return ([optimizer], [scheduler, ...]))")
    monitor = configured.get("monitor")
    if monitor is not None and scheduler is None:
        raise ValueError(f"configure_optimizers dict: monitor={monitor!r} without an 'lr_scheduler' to use it")
    return configured["optimizer"], [] if scheduler is None else [scheduler], monitor


def _require_state(scheduler: Any, shapes: str) -> None:
    """A scheduler's state goes into checkpoints: it needs ``state_dict`` and ``load_state_dict``
    (a TypeError, as Lightning's)."""
    if not (callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict", None))):
        raise TypeError(f"lr_scheduler {_describe(scheduler)} has no state_dict() / load_state_dict() methods, which "
                        f"checkpoints save and restore it with: define both. {shapes}")


def _read_scheduler(given: Any, optimizer: torch.optim.Optimizer, monitor: Any,
                    default_interval: str = "step", steps_schedulers: bool = False) -> LRSchedulerConfig:
    """One scheduler (or scheduler dict) as an LRSchedulerConfig, every key checked. A scheduler that
    is not torch's needs ``steps_schedulers`` (the module's ``lr_scheduler_step``)."""
    options = dict(given) if isinstance(given, dict) else {"scheduler": given}
    unknown = sorted(set(options) - set(SCHEDULER_DICT_KEYS), key=str)
    if unknown:
        raise ValueError(f"lr_scheduler dict: unknown keys {unknown}; the keys are {list(SCHEDULER_DICT_KEYS)}")
    if "scheduler" not in options:
        raise ValueError(f"lr_scheduler dict has no 'scheduler' key; the keys are {list(SCHEDULER_DICT_KEYS)}")
    scheduler = options["scheduler"]
    if _is_optimizer(scheduler):
        raise TypeError(
            f"configure_optimizers gave a {type(scheduler).__name__} optimizer where a scheduler belongs (several "
            f"optimizers need automatic_optimization = False). {ACCEPTED}"
        )
    torch_kind = isinstance(scheduler, (LRScheduler, ReduceLROnPlateau))
    if not torch_kind:
        _require_state(scheduler, ACCEPTED)
        if not steps_schedulers:  # (Lightning's exception class, and the phrase programs match)
            raise MisconfigurationException(
                f"lr_scheduler {type(scheduler).__name__} doesn't follow PyTorch's LRScheduler API (it is not a "
                "torch.optim.lr_scheduler.LRScheduler or ReduceLROnPlateau), so the trainer cannot step it: override "
                "the module's lr_scheduler_step(scheduler, metric) to step it, or use a torch scheduler")
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError(f"lr_scheduler {type(scheduler).__name__} was built on another optimizer than the one "
                         "configure_optimizers returned; build it on that optimizer")
    kind = type(scheduler).__name__
    # a scheduler of the module's own steps with a metric where its dict says reduce_on_plateau=True
    is_plateau = isinstance(scheduler, ReduceLROnPlateau) if torch_kind else options.get("reduce_on_plateau", False)
    plateau = options.get("reduce_on_plateau", is_plateau)
    if plateau is not is_plateau:
        raise ValueError(f"lr_scheduler dict: reduce_on_plateau={plateau!r} for a {kind}; it is "
                         f"{is_plateau} for this scheduler (only ReduceLROnPlateau steps with a metric)")
    interval = options.get("interval", default_interval)
    if interval not in INTERVALS:
        raise ValueError(f"lr_scheduler dict: interval={interval!r}; the intervals are {list(INTERVALS)}")
    frequency = options.get("frequency", 1)
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"lr_scheduler dict: frequency={frequency!r}; it must be an integer >= 1")
    name = options.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"lr_scheduler dict: name={name!r}; it must be a non-empty string or None")
    strict = options.get("strict", True)
    if not isinstance(strict, bool):
        raise ValueError(f"lr_scheduler dict: strict={strict!r}; it must be True or False")
    own_monitor = options.get("monitor", monitor)
    if not is_plateau:
        # Lightning accepts them on any scheduler and uses them for ReduceLROnPlateau only: they change
        # nothing here, so they are accepted with one warning (lightning-hydra-template sets monitor on every scheduler).
        given = [key for key in ("monitor", "strict") if key in options or (key == "monitor" and monitor is not None)]
        if given:
            rank_zero_warn(log, "lr_scheduler %s: %s only used by ReduceLROnPlateau (it steps with a metric): ignored "
                           "for this scheduler, which steps every %s", kind, " and ".join(repr(k) for k in given), interval)
        return LRSchedulerConfig(scheduler, name=name, interval=interval, frequency=frequency)
    if not isinstance(own_monitor, str) or not own_monitor:
        raise ValueError(
            f"ReduceLROnPlateau needs monitor='val/...' (it steps at each validation end), 'train/...' (at each "
            f"logging step) or a name the module logs with self.log (where it is computed), got "
            f"monitor={own_monitor!r}; e.g. {{'optimizer': optimizer, 'lr_scheduler': "
            "{'scheduler': scheduler, 'monitor': 'val/loss'}}"
        )
    if "interval" in options and distributed.rank() == 0:
        log.warning("lr_scheduler ReduceLROnPlateau(monitor=%r): interval=%r is not used; it steps when its monitor "
                    "is computed (%s), frequency counting those", own_monitor, interval,
                    "each validation end" if own_monitor.startswith("val/") else "each logging step"
                    if own_monitor.startswith("train/") else "where the module's self.log values are reduced")
    return LRSchedulerConfig(scheduler, name=name, interval=interval, frequency=frequency, reduce_on_plateau=True,
                             monitor=own_monitor, strict=strict)
