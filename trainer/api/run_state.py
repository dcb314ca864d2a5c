"""Where a run stands, readable from the module and the trainer with Lightning's names.

Every value holds in every strategy. Units: ``global_step`` counts optimizer steps (as Lightning;
a step of K accumulated micro-batches is one; under manual optimization every ``opt.step()`` of the
module, e.g. 2 per batch in a GAN: trainer/loop/step_limits.py), ``current_epoch`` counts finished epochs (0-based
while the first epoch runs). During a run they are live (read from the rank's run); after ``fit``
returns they hold the final values, also on the caller's object when the trainer spawned its
workers (each worker trains a pickled copy of the trainer).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from trainer.api.run_view import RunView
from trainer.runtime import distributed


class TrainerState(NamedTuple):
    """``trainer.state``: the call (``fn``), what runs now in it (``stage``) and where the call stands
    (``status``: "initializing" before the first call, "running", "finished", or "interrupted" when it
    raised), Lightning's values as strings."""

    fn: str | None
    stage: str | None
    status: str = "initializing"

    @property
    def finished(self) -> bool:
        """Whether the last call finished without an error."""
        return self.status == "finished"

    @property
    def stopped(self) -> bool:
        """Whether the last call is over (finished or interrupted)."""
        return self.status in ("finished", "interrupted")


def cuda_devices() -> int:
    """The CUDA devices torch sees in this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class RankProperties:
    """``global_rank`` and ``local_rank`` (Lightning's names), on the Trainer and the module."""

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 in one process and in the caller of a spawned run)."""
        return distributed.rank()

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (``LOCAL_RANK`` / ``SLURM_LOCALID``; 0 in one process)."""
        return distributed.local_rank()


class TrainerRunState(RankProperties):
    """The run-state properties of ``Trainer`` (a mixin: the values live on the rank's run while
    one is going on)."""

    #: the ModelCheckpoint class of the default checkpointing (None: the trainer's own, step-<n>/ folders)
    default_checkpoint_class: Any = None
    #: whether the first step's FLOPs by module are written to ``<run_dir>/flops.txt``
    write_flops_file: bool = True
    #: how many CUDA devices this process can use, read when the Trainer is built (``accelerator="cuda"``
    #: refused with none, ``devices="auto"``); the device a rank trains on is always torch's answer
    cuda_device_count = staticmethod(cuda_devices)
    _run_view: RunView | None = None  # set by the loop while (and after) it runs a call of this trainer

    def __getstate__(self) -> dict:
        # A spawned worker gets a copy of the trainer: never the caller's finished run.
        state = dict(self.__dict__)
        state["_run_view"] = None
        state.pop("_model", None)  # the last in-process call's wrapped module stays with the caller
        state.pop("_last_optimization", None)  # (and the last fit's optimizers)
        return state

    # progress: live during a run, stored after it (set by trainer/loop/weights_return.py)
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (a step over K accumulated micro-batches counts once; under
        manual optimization each ``opt.step()`` of the module)."""
        return self._run_view.global_step if self._run_view is not None else self._global_step

    @global_step.setter
    def global_step(self, value: int) -> None:
        self._global_step = value
        self._batches = value  # (set_progress sets the batches after this when they differ)

    def stored_progress(self) -> tuple[int, int, int]:
        """(batches, global_step, current_epoch) as the last call left them, even while a new run is
        set up (the properties read the run then). Batches are the logged step axis; they differ from
        global_step under manual optimization only."""
        return getattr(self, "_batches", self._global_step), self._global_step, self._current_epoch

    @property
    def current_epoch(self) -> int:
        """The epoch being trained (0-based); after fit, the number of finished epochs."""
        return self._run_view.epoch if self._run_view is not None else self._current_epoch

    @current_epoch.setter
    def current_epoch(self, value: int) -> None:
        self._current_epoch = value

    @property
    def logged_metrics(self) -> dict[str, float]:
        """The last logged value of each metric (``train/...`` on logging steps, ``val/...`` after
        validation), reduced over all ranks."""
        return dict(self._run_view.callback_metrics) if self._run_view is not None else self._logged_metrics

    @logged_metrics.setter
    def logged_metrics(self, value: dict[str, float]) -> None:
        self._logged_metrics = value

    @property
    def callback_metrics(self) -> dict[str, float]:
        """What callbacks and monitors see: the last logged value of each metric (as ``logged_metrics``)."""
        return dict(self._run_view.callback_metrics) if self._run_view is not None else self._callback_metrics

    @callback_metrics.setter
    def callback_metrics(self, value: dict[str, float]) -> None:
        self._callback_metrics = value

    @property
    def state(self) -> TrainerState:
        """Lightning's ``trainer.state``: ``fn`` (the call: "fit", "validate", "test", "predict") and
        ``stage`` (what runs now: "train", "sanity_check", "validate", "test", "predict"; None outside a call)
        and ``status`` ("running" during a call; after it "finished", or "interrupted" when it raised)."""
        view = self._run_view
        if view is not None:
            return TrainerState(getattr(self, "stage", None), view.running_stage, "running")
        return TrainerState(getattr(self, "stage", None), None, self.__dict__.get("_status", "initializing"))

    @property
    def num_training_batches(self) -> int | float:
        """This rank's micro-batches per epoch during a fit (Lightning's; inf for a stream); after a call, the
        last call's count (0 before any)."""
        if self._run_view is not None:
            return self._run_view.num_training_batches
        return self.__dict__.get("_last_batch_counts", (0, []))[0]

    @property
    def num_val_batches(self) -> list[int]:
        """This rank's batches of the current (or last) validation pass, as Lightning's one entry per loader
        (after a call, its last pass's; [] before any)."""
        if self._run_view is not None:
            return self._run_view.num_val_batches
        return list(self.__dict__.get("_last_batch_counts", (0, []))[1])

    @property
    def training(self) -> bool:
        """Whether training runs now (a fit, outside its validation passes)."""
        return self.state.stage == "train"

    @property
    def validating(self) -> bool:
        """Whether a validation pass runs now (in fit or validate; not the sanity check)."""
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        """Whether ``Trainer.test``'s pass runs now."""
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        """Whether ``Trainer.predict``'s pass runs now."""
        return self.state.stage == "predict"

    @property
    def sanity_checking(self) -> bool:
        """Whether the sanity validation before training is running (Lightning's flag; its metrics are
        not logged, and metric watchers such as EarlyStopping skip it)."""
        return self._run_view is not None and self._run_view.sanity_checking

    @property
    def is_global_zero(self) -> bool:
        """True on the process of global rank 0 (and in the caller of a spawned fit)."""
        if self._run_view is not None:
            return self._run_view.rank == 0
        return distributed.rank() == 0

    @property
    def log_dir(self) -> str:
        """The run directory: loggers, checkpoints (by default) and ``train.log`` go there; the same
        on every rank during a run (rank 0's)."""
        return self.run_dir

    @property
    def checkpoint_callback(self) -> Any:
        """The ModelCheckpoint given in ``callbacks``, or the one of Lightning's default checkpointing
        (``best_model_path``, ``last_model_path`` ...); None when checkpoints are set with ``checkpoint=``
        or turned off."""
        return self.__dict__.get("_checkpoint_callback")

    def save_checkpoint(self, filepath: Any, weights_only: bool = False, storage_options: Any = None) -> None:
        """Save the run's state into the file ``filepath`` (Lightning's ``.ckpt`` shape, resumable with
        ``ckpt_path=``; ``weights_only``: the model's weights only): while a call runs, from a hook or a
        callback, on every rank (a collective)."""
        if storage_options is not None:
            raise ValueError(f"save_checkpoint(storage_options={storage_options!r}): no checkpoint IO plugin here; "
                             "give storage_options=None")
        if self._run_view is None:
            raise RuntimeError(f"trainer.save_checkpoint({filepath!r}) outside a running fit: call it from a hook or "
                               "a callback (or use ModelCheckpoint); after fit, the newest checkpoint is on disk")
        self._run_view.save_checkpoint(filepath, weights_only)

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        """Every ModelCheckpoint among the callbacks (Lightning's list; [] without one)."""
        callback = self.checkpoint_callback
        if callback is None:
            return []
        found = [other for other in getattr(self, "callbacks", []) if hasattr(type(other), "kth_best_model_path")]
        return found if callback in found else [callback]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The run's optimizers as a list (as the strategy set them up: ZeRO-1's wrapper): one item,
        or several under manual optimization; [] before ``configure_optimizers`` ran; after an
        in-process ``fit``, its optimizers (as Lightning keeps them)."""
        if self._run_view is not None:
            return self._run_view.optimizers
        return list(self.__dict__.get("_last_optimization", ([], []))[0])

    @property
    def lr_schedulers(self) -> list[Any]:
        """The run's learning-rate schedulers, in the order ``configure_optimizers`` returned them."""
        return [config.scheduler for config in self.lr_scheduler_configs]

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """One ``LRSchedulerConfig`` per scheduler (``scheduler``, ``interval``, ``frequency``,
        ``monitor`` ...: Lightning's name), in the order ``configure_optimizers`` returned them (after an
        in-process ``fit``: its configs)."""
        if self._run_view is not None:
            return self._run_view.lr_scheduler_configs
        return list(self.__dict__.get("_last_optimization", ([], []))[1])

    @property
    def estimated_stepping_batches(self) -> int:
        """Optimizer steps this fit will run (``max_steps`` / ``max_epochs`` x steps per epoch,
        whichever is smaller): known from ``configure_optimizers`` on (e.g. for ``OneCycleLR``). Under
        manual optimization ``max_steps`` when it alone bounds the run, else an error saying why it
        is unknown up front (trainer/loop/step_limits.py)."""
        total = self._run_view.estimated_stepping_batches if self._run_view is not None else None
        if total is None:
            raise RuntimeError("trainer.estimated_stepping_batches is known once fit has read the data "
                               "(from configure_optimizers on)")
        if isinstance(total, str):  # why it cannot be known before the run
            raise RuntimeError(total)
        return total

    @property
    def should_stop(self) -> bool:
        """Whether training was asked to stop (on this rank, until the ranks agreed). Set it to True
        from a hook or a callback, on one rank or all: every rank stops together at the next logging
        step (``log_every_n_steps``, and the last step), with the final validation and ``save_last``
        as at a normal end. The same step on any world size; no collective on other steps."""
        if self._run_view is None:  # after a call: whether its training was stopped (Lightning's)
            return bool(self.__dict__.get("_stopped", False))
        return self._run_view.stop_requested

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"trainer.should_stop must be True or False, got {value!r}")
        if self._run_view is None:
            raise RuntimeError("trainer.should_stop can be set only while fit runs (from a hook or a callback)")
        self._run_view._run.ask_stop_at_next_logging_step(value)  # (the loop refuses False after an agreed stop)


class ModuleRunState(RankProperties):
    """The run-state properties of ``TrainModule`` (a mixin). Without a trainer: the values of an
    unattached module (step 0, rank 0 of 1, the device of its parameters)."""

    @property
    def global_rank(self) -> int:
        """The attached trainer's ``global_rank`` (as Lightning's); this process's rank without one."""
        trainer = self.__dict__.get("_trainer")
        return trainer.global_rank if trainer is not None else RankProperties.global_rank.fget(self)

    @property
    def local_rank(self) -> int:
        """The attached trainer's ``local_rank`` (as Lightning's); this process's rank on its node without one."""
        trainer = self.__dict__.get("_trainer")
        return trainer.local_rank if trainer is not None else RankProperties.local_rank.fget(self)

    @property
    def device(self) -> torch.device:
        """The device this rank trains on during a run; else the device of the first parameter."""
        trainer = self.__dict__.get("_trainer")
        view = getattr(trainer, "_run_view", None)
        if view is not None and getattr(view._run, "device", None) is not None:
            return view.device
        for tensor in self.parameters():  # type: ignore[attr-defined]
            return tensor.device
        return torch.device("cpu")

    @property
    def dtype(self) -> Any:
        """The floating dtype of the module's parameters (Lightning's ``self.dtype``; the default dtype
        without any). A module that sets ``self.dtype`` itself reads back its own value."""
        if "_own_dtype" in self.__dict__:
            return self.__dict__["_own_dtype"]
        for tensor in self.parameters():  # type: ignore[attr-defined]
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    @dtype.setter
    def dtype(self, value: Any) -> None:
        self.__dict__["_own_dtype"] = value  # (an attribute of the module's own, as before Lightning's name)

    @property
    def on_gpu(self) -> bool:
        """Whether this rank trains on a CUDA device."""
        return self.device.type == "cuda"

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only (Lightning's ``self.print``)."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (``trainer.global_step``; 0 without a trainer)."""
        trainer = self.__dict__.get("_trainer")
        return trainer.global_step if trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The epoch being trained (``trainer.current_epoch``; 0 without a trainer)."""
        trainer = self.__dict__.get("_trainer")
        return trainer.current_epoch if trainer is not None else 0

    @property
    def logger(self) -> Any:
        """The trainer's first logger (``trainer.logger``; None without a trainer or loggers). On
        ranks other than 0, ``self.logger.experiment`` accepts any call and does nothing."""
        trainer = self.__dict__.get("_trainer")
        return trainer.logger if trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """The trainer's loggers (``trainer.loggers``; [] without a trainer)."""
        trainer = self.__dict__.get("_trainer")
        return trainer.loggers if trainer is not None else []

    @property
    def world_size(self) -> int:
        """The number of processes of the run (1 without torch.distributed)."""
        return distributed.world_size()
