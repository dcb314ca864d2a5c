"""The public, read-only view of one rank's run: what callbacks, the Trainer's run properties and
the tools see while a fit runs (the run's own state lives in the loop and is written there only).

``run_of(trainer)`` gives it to a callback; every value is live (read when asked)::

    view = run_of(trainer)
    view.step, view.global_step, view.epoch          # progress (batches, optimizer steps, epoch)
    view.rank, view.world_size, view.device, view.run_dir
    view.optimizers, view.lr_scheduler_configs       # as the strategy set them up
    view.callback_metrics                            # the last logged value of each metric
    view.has_validation                              # whether the module validates
    view.sanity_checking                             # the sanity validation is running
    view.stop_requested, view.stop_request           # a stop asked for; (who, why)
    view.log({"name": value})                        # written by the run's loggers (rank 0)
    view.request_stop("why")                         # end training at the end of this step

Setting anything else is an error: the loop owns the run's counters.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Protocol

import torch


class RunSource(Protocol):
    """What the loop's run gives the view (the loop's run object has these attributes)."""

    step: int
    global_step: int
    epoch: int
    rank: int
    device: torch.device
    run_dir: str
    optimizer: Any  # one optimizer, or a list under manual optimization with several
    lr_scheduling: Any  # its ``configs``: one LRSchedulerConfig per scheduler
    last_metrics: dict[str, float]
    val_set: Any
    validates: bool  # validation data given (read, or to be read at the first validation pass)
    data_parallel_size: int
    total_steps: int | str | None
    sanity_checking: bool

    def log(self, metrics: dict[str, float]) -> None: ...

    def save_checkpoint(self, path: Any, weights_only: bool = False) -> str:
        """Save the run's state into the file ``path`` (a collective: every rank calls it)."""
        return self._run.save_checkpoint_file(path, weights_only)

    def request_stop(self, reason: str) -> None: ...

    def stop_requested(self) -> bool: ...

    def stop_request(self) -> tuple[str, str] | None: ...

    def ask_stop_at_next_logging_step(self, value: bool) -> None: ...


class RunView:
    """A read-only window on one rank's run (see the module docstring for what it shows)."""

    __slots__ = ("_run",)

    def __init__(self, run: RunSource):
        object.__setattr__(self, "_run", run)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the run view is read-only (setting {name!r}); the loop owns the run's state: "
                             "use log() or request_stop(), or trainer.should_stop = True")

    def __repr__(self) -> str:
        return f"RunView(step={self.step}, epoch={self.epoch}, rank={self.rank})"

    # ----- progress ------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Global batches trained so far (the logged step axis; the ``step`` the hooks get)."""
        return self._run.step

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (more than ``step`` under manual optimization with several)."""
        return self._run.global_step

    @property
    def epoch(self) -> int:
        """The epoch being trained, 0-based."""
        return self._run.epoch

    @property
    def estimated_stepping_batches(self) -> int | str | None:
        """Optimizer steps this fit will run; a string saying why it is unknown; None before the data is read."""
        return self._run.total_steps

    # ----- where ---------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self._run.rank

    @property
    def data_parallel_size(self) -> int:
        """The ranks that load different samples."""
        return self._run.data_parallel_size

    @property
    def device(self) -> torch.device:
        """The device this rank trains on."""
        return self._run.device

    @property
    def run_dir(self) -> str:
        """The run directory (rank 0's, the same on every rank)."""
        return self._run.run_dir

    # ----- what trains ---------------------------------------------------------------------------
    @property
    def optimizers(self) -> list[Any]:
        """The run's optimizers as a list (as the strategy set them up: ZeRO-1's wrapper)."""
        optimizer = self._run.optimizer
        if isinstance(optimizer, list):
            return list(optimizer)
        return [optimizer] if optimizer is not None else []

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """One ``LRSchedulerConfig`` per scheduler of ``configure_optimizers`` (Lightning's name)."""
        scheduling = self._run.lr_scheduling
        return list(getattr(scheduling, "configs", []))

    @property
    def batch(self) -> Any:
        """The run's resolved batch settings (``BatchSettings``; None before the data is read)."""
        return getattr(self._run, "batch", None)

    @property
    def has_validation(self) -> bool:
        """Whether this run validates (the module or datamodule gives validation data)."""
        return self._run.validates

    @property
    def num_training_batches(self) -> int | float:
        """This rank's micro-batches per epoch (inf for a stream; 0 before the data is read)."""
        return getattr(self._run, "num_training_batches", 0)

    @property
    def num_val_batches(self) -> list[int]:
        """This rank's batches of the current (or last) validation pass, one entry per loader (one)."""
        return list(getattr(self._run, "num_val_batches", []))

    @property
    def num_eval_batches(self) -> dict[str, list[int]]:
        """This rank's batches per loader of the test / predict pass ({"test": [...]})."""
        return dict(getattr(self._run, "num_eval_batches", {}))

    @property
    def returned_loaders(self) -> dict[str, Any]:
        """What each stage's data hook last returned ({"train": ..., "val": ...}; {} before the data is read)."""
        data = self._run.__dict__.get("data")
        return dict(data.returned) if data is not None else {}

    @property
    def running_stage(self) -> str | None:
        """What runs now: "train", "sanity_check", "validate", "test" or "predict" (None before and after)."""
        return getattr(self._run, "running_stage", None)

    @property
    def sanity_checking(self) -> bool:
        """Whether the sanity validation before training is running (its metrics are not logged)."""
        return self._run.sanity_checking

    @property
    def callback_metrics(self) -> Mapping[str, float]:
        """The last logged value of each metric, reduced over all ranks (read-only); a name logged both
        on_step and on_epoch is there under its own name too, with the latest of the two (Lightning's
        rule). Inside a training
        step (e.g. ``on_train_batch_end``), the values ``self.log`` took in that batch, as this rank
        logged them (tensors, not reduced: no sync on steps that do not log), until the logging step's
        reduced values replace them."""
        run = self._run
        logs = getattr(run, "module_logs", None)
        metrics = {**run.last_metrics, **getattr(logs, "bare", {}), **getattr(logs, "batch_values", {})}
        metrics.pop("epoch", None)  # (the loggers' epoch axis, not a metric; Lightning's callback_metrics lack it)
        return MappingProxyType(metrics)

    @property
    def eval_step_values(self) -> Mapping[str, float]:
        """The latest evaluation batch rows' values (``self.log(..., on_step=True)`` in validation or
        test) under Lightning's ``Trainer``; not in ``callback_metrics`` (Lightning's rule)."""
        return MappingProxyType(getattr(self._run, "eval_step_values", {}))

    @property
    def prog_bar_names(self) -> frozenset[str]:
        """The names of `callback_metrics` that ``self.log(..., prog_bar=True)`` gives."""
        logs = getattr(self._run, "module_logs", None)
        return logs.prog_bar_names() if logs is not None else frozenset()

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was asked for (by a callback, or ``trainer.should_stop`` on this rank)."""
        return self._run.stop_requested()

    @property
    def stop_request(self) -> tuple[str, str] | None:
        """(who asked, why) once a callback requested a stop (after the ranks agreed: the same on
        every rank, the asker's rank named); None while none did."""
        return self._run.stop_request()

    # ----- the two writes ------------------------------------------------------------------------
    def log(self, metrics: dict[str, float]) -> None:
        """Record ``{name: float}`` at the current step with the run's loggers (which exist on rank 0)."""
        self._run.log(metrics)

    def save_checkpoint(self, path: Any, weights_only: bool = False) -> str:
        """Save the run's state into the file ``path`` (a collective: every rank calls it)."""
        return self._run.save_checkpoint_file(path, weights_only)

    def request_stop(self, reason: str) -> None:
        """End training at the end of the current step, with the final validation and ``save_last``
        as at a normal end; the log names the callback that asked."""
        self._run.request_stop(reason)
