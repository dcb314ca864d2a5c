"""When the learning-rate schedulers step, and their stepping state for checkpoints.

Each scheduler of ``configure_optimizers`` is an `LRSchedulerConfig` (Lightning's name and
fields) and steps on one kind of event, every ``frequency`` events:

- ``interval="step"`` (the default): optimizer steps. An fp16 step skipped for a gradient overflow
  is not an optimizer step: the scheduler neither steps nor counts it (as before this file existed),
  except where fp16 steps sync-free (a fused optimizer skips on the device overflow flag, so the host
  does not know about the skip without a read: trainer/precision/fp16_step.py): there a skipped step
  advances the schedule too, as with torch.amp.GradScaler and Lightning.
- ``interval="epoch"``: finished epochs (an epoch cut short by ``max_steps`` or a stop is not one).
- ``ReduceLROnPlateau``: the events where its ``monitor`` is already on the host, so that it never
  adds a host sync or a collective: validation ends for a ``val/...`` monitor, logging steps
  (``trainer.log_every_n_steps``) for a ``train/...`` monitor. The metrics there are reduced over
  all ranks, so every rank takes the same decision. A monitor missing from those metrics is an
  error at the first such event (``strict=False``: the scheduler skips that event, with one warning).
  A monitor named as the module logs it (``self.log("val_loss", ...)``: no prefix) steps the scheduler
  at every validation end, logging step and training-epoch end whose metrics hold it; it is an error
  (strict) at a validation end (or, without validation data, a training-epoch end) if it is neither
  there nor a name ``self.log`` has been given in this run.

The event counters are saved in checkpoints with the schedulers' own states, so a resumed run steps
exactly as an uninterrupted one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from trainer.runtime import distributed
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)

INTERVALS = ("step", "epoch")
MONITOR_PREFIXES = ("val/", "train/")


@dataclass
class LRSchedulerConfig:
    """A scheduler and when it steps (the keys of a scheduler dict in ``configure_optimizers``)."""

    scheduler: Any
    name: str | None = None  # the name LearningRateMonitor logs its learning rates under
    interval: str = "step"  # "step" or "epoch" (Lightning's default is "epoch"); not used by ReduceLROnPlateau
    frequency: int = 1  # step every this many events
    reduce_on_plateau: bool = False  # steps with the value of ``monitor`` (ReduceLROnPlateau)
    monitor: str | None = None  # "val/..." or "train/..."
    strict: bool = True  # a missing monitor is an error (False: skip that event, with one warning)

    @property
    def event(self) -> str:
        """What this scheduler counts: "step", "epoch", "validation" or "logging"."""
        if self.reduce_on_plateau:
            if not self.monitor.startswith(MONITOR_PREFIXES):
                return "logged"  # a self.log name: wherever it is reduced
            return "validation" if self.monitor.startswith("val/") else "logging"
        return self.interval

    def describe(self) -> str:
        return type(self.scheduler).__name__ + (f"(monitor={self.monitor!r})" if self.monitor else "")


class LRScheduling:
    """Steps the schedulers of a run at their events (see the module docstring)."""

    def __init__(self, configs: list[LRSchedulerConfig] | None = None):
        self.configs = list(configs or [])
        self.events = [0] * len(self.configs)  # events counted per scheduler (saved in checkpoints)
        self._by_event = {kind: [i for i, c in enumerate(self.configs) if c.event == kind]
                          for kind in ("step", "epoch", "validation", "logging", "logged")}
        self._reported: set[int] = set()  # strict=False schedulers whose missing monitor was reported
        self._has_val_set = True
        #: the names self.log was given so far in this run (set by the loop; for "logged" monitors)
        self.known_names: Any = set

    def step_scheduler(self, scheduler: Any, metric: Any) -> None:
        """Step one scheduler (``metric``: a ReduceLROnPlateau's monitored value, else None). The loop
        replaces this with the module's ``lr_scheduler_step`` where the module overrides it."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def check_fit(self, has_val_set: bool, validates_during_training: bool, rank: int) -> None:
        """At fit start: a ``val/`` monitor without validation data is an error (it is never logged);
        one warning where validation runs only at the end of training (``validates_during_training``
        False: no ``val_every_n_steps``, ``val_check_interval`` or ``check_val_every_n_epoch``)."""
        self._has_val_set = has_val_set
        for index in self._by_event["validation"]:
            config = self.configs[index]
            if not has_val_set:
                raise ValueError(f"lr_scheduler {config.describe()} steps on a validation metric, but the module has no "
                                 "val_dataset(): return one, or monitor a 'train/...' metric")
            if not validates_during_training and rank == 0:
                log.warning("lr_scheduler %s steps at validation ends: none of trainer.val_every_n_steps, "
                            "val_check_interval, check_val_every_n_epoch is set, so validation (and this scheduler) "
                            "runs only once, at the end of training", config.describe())

    def _due(self, index: int) -> bool:
        self.events[index] += 1
        return self.events[index] % self.configs[index].frequency == 0

    def after_optimizer_step(self) -> None:
        for index in self._by_event["step"]:
            if self._due(index):
                self.step_scheduler(self.configs[index].scheduler, None)

    def after_epoch(self) -> None:
        """After a finished epoch."""
        for index in self._by_event["epoch"]:
            if self._due(index):
                self.step_scheduler(self.configs[index].scheduler, None)

    def on_logging_step(self, step: int, metrics: dict[str, float]) -> None:
        """With the reduced training metrics of a logging step (Python floats: no sync)."""
        self._plateau("logging", metrics, f"training metrics of logging step {step}")
        self._plateau_logged(metrics, None)

    def on_epoch_metrics(self, epoch: int, metrics: dict[str, float]) -> None:
        """With the reduced ``self.log`` epoch values of a finished training epoch."""
        self._plateau_logged(metrics, None if self._has_val_set else f"training-epoch {epoch} metrics")

    def on_validation_end(self, metrics: dict[str, float]) -> None:
        """With the reduced validation metrics."""
        self._plateau("validation", metrics, "validation metrics")
        self._plateau_logged(metrics, "validation metrics")

    def _plateau_logged(self, metrics: dict[str, float], checked: str | None) -> None:
        """Self.log-named monitors: step where present. Absent ones are skipped, except where
        ``checked`` names the event: there a monitor that is not a name self.log was given in this
        run is handled as a missing monitor (an error, or a warning with strict=False)."""
        known = set(self.known_names()) if checked is not None else None
        elsewhere = {c.monitor: None for c in self.configs
                     if c.monitor not in metrics and (known is None or c.monitor in known)}
        self._plateau("logged", {**elsewhere, **metrics}, checked or "", skip_absent=True)

    def _plateau(self, kind: str, metrics: dict[str, Any], where: str, skip_absent: bool = False) -> None:
        for index in self._by_event[kind]:
            config = self.configs[index]
            if skip_absent and config.monitor in metrics and metrics[config.monitor] is None:
                continue  # a self.log name reduced at another event (or not yet)
            if config.monitor not in metrics:
                message = (f"lr_scheduler {config.describe()}: {config.monitor!r} is not among the {where}, "
                           f"which are {sorted(k for k, v in metrics.items() if v is not None)}")
                if config.strict:
                    raise ValueError(f"{message}; monitor one of them (or set strict=False to skip a step when it is missing)")
                if index not in self._reported:
                    self._reported.add(index)
                    rank_zero_warn(log, "%s; strict=False: the scheduler skips this event (further misses are not reported)", message)
                continue
            if self._due(index):
                self.step_scheduler(config.scheduler, metrics[config.monitor])

    # ----- checkpoints ------------------------------------------------------------------------------
    def schedule_steps(self) -> int | None:
        """The length in optimizer steps of the first schedule that states one (``schedule_length``),
        recorded in checkpoints so that resuming with another length is said, not silent."""
        from trainer.optim.schedules import schedule_length

        lengths = (schedule_length(config.scheduler) for config in self.configs)
        return next((length for length in lengths if length is not None), None)

    def state_dict(self) -> dict[str, Any]:
        return {"schedulers": [c.scheduler.state_dict() for c in self.configs],
                "kinds": [type(c.scheduler).__name__ for c in self.configs], "events": list(self.events)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict`'s output (or a checkpoint's single scheduler state from before the
        counters existed: that scheduler stepped at every optimizer step, so its counter is 0)."""
        if state is not None and "events" not in state:
            state = {"schedulers": [state], "kinds": [type(self.configs[0].scheduler).__name__] if self.configs else [None],
                     "events": [0]}
        saved = state["kinds"] if state is not None else []
        ours = [type(c.scheduler).__name__ for c in self.configs]
        if saved != ours:
            if distributed.rank() == 0:  # every rank would say the same
                log.warning("the checkpoint's lr schedulers %s differ from this run's %s: this run's schedulers start "
                            "from their initial state", saved, ours)
            return
        if state is None:
            return
        for config, scheduler_state in zip(self.configs, state["schedulers"]):
            config.scheduler.load_state_dict(scheduler_state)
        self.events = [int(n) for n in state["events"]]
