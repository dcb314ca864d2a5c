"""The Callback interface: code that watches (and may stop) a run without being part of the model.

Every hook takes Lightning's leading arguments ``(trainer, module)``: the `Trainer`
running the fit and the user's `TrainModule`. Every Lightning callback
hook is called, where Lightning calls it and in its order: the callbacks' hook before the module's
hook of the same name, the callbacks in the order given (the whole loop with every hook:
``trainer/api/module.py``; the table: ``trainer/api/hook_table.py``). Ours besides Lightning's:
``on_train_step_end(trainer, module, step, metrics)`` after each optimizer step, and
``on_validation_end`` also gets the reduced metrics (Lightning's shape without them works too).
Callbacks with ``watches_metrics = True`` (EarlyStopping) get ``on_train_epoch_end`` after the module.

A callback whose hook has the shape of before (``on_fit_start(self, run)``,
``on_train_step_end(self, run, step, metrics)``) is refused when the Trainer is built, naming the
new shape (``trainer/callbacks/hook_shapes.py``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from trainer.api.run_view import RunView

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer  # (annotations only: Lightning's hook signature names the Trainer)


class Callback:
    """Base class of callbacks: every hook is a no-op; override the ones you need.

    Every hook runs on every rank, before the module's hook of the same name (the order is in
    ``trainer/api/module.py``'s docstring), with ``trainer`` (the
    Trainer: its settings, e.g. ``trainer.log_every_n_steps``, and progress) and ``module``. While a
    fit runs, `run_of` gives a callback the rank's `RunView`, a
    read-only view for what the Trainer object does not carry: ``view.optimizers``,
    ``view.lr_scheduler_configs`` (an ``LRSchedulerConfig`` per scheduler), ``view.step`` (global
    batches, as the ``step`` the hooks get; ``view.global_step`` counts optimizer steps: more under
    manual optimization), ``view.epoch``, ``view.rank``, ``view.run_dir``, ``view.has_validation``,
    ``view.callback_metrics``; ``view.log(metrics)`` (record ``{name: float}`` at the current step
    with the run's loggers, which exist on rank 0 only) and ``view.request_stop(reason)`` (end training
    at the end of the current step, with a final validation and ``save_last`` as at a normal end; the
    log names the callback).

    **Stopping on every rank together.** A decision computed from the metrics the hooks receive is
    already the same on every rank (they are reduced over all ranks). A decision that can differ
    between ranks (wall-clock time, a file on a local disk) must be taken in ``on_train_step_end``
    on steps for which `stop_needs_agreement` returns True: on those steps only, the trainer
    agrees with one tiny all-reduce and stops every rank if any asked. Other steps make no
    collective, so a rank-local request on them would stop one rank alone and hang the others.

    **Checkpoints.** `state_dict` is saved (from rank 0) with every checkpoint and given back to
    `load_state_dict` on resume, before ``on_fit_start``. It must hold only what
    ``torch.load(weights_only=True)`` reads: numbers, strings, None, bools, lists, dicts and tensors.

    **No host sync.** The batch hooks get the tensors as they are (on the device); reading one
    (``.item()``, ``float()``) there adds a host sync to every micro-batch.
    """

    @property
    def state_key(self) -> str:
        """The name this callback's state is saved under (default: the class name)."""
        return type(self).__qualname__

    # ----- logging -------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, **options: Any) -> None:
        """``module.log(name, value, **options)`` of the module being run (Lightning's callbacks log
        so, from their hooks): the same names, options and hooks as the module's ``self.log``."""
        _logging_module(self, name).log(name, value, **options)

    def log_dict(self, dictionary: Any, **options: Any) -> None:
        """``module.log_dict(dictionary, **options)`` of the module being run (see `log`)."""
        _logging_module(self, "log_dict").log_dict(dictionary, **options)

    # ----- hooks ---------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        """The model is wrapped, the optimizer built and a checkpoint restored; no step ran yet."""

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first step of an epoch (also of the rest of an epoch a resume goes on in)."""

    def on_train_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int) -> None:
        """Before the forward of each micro-batch; ``batch_idx`` counts micro-batches in the epoch."""

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """After the backward of each micro-batch; ``outputs`` is what ``training_step`` returned
        (tensors on the device; None under the pipeline strategy, which runs the steps itself)."""

    def on_train_step_end(self, trainer: Trainer, module: TrainModule, step: int,
                          metrics: dict[str, float] | None) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds the reduced training metrics
        on logging steps (``trainer.log_every_n_steps``) and is None on the others (reading a device
        value there would add a host sync to the step)."""

    def on_validation_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first batch of a validation pass."""

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each validation batch of this rank; ``outputs`` is what ``validation_step`` returned."""

    def on_validation_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After a validation pass, its metrics reduced and logged (``on_validation_end`` gets them)."""

    def on_validation_end(self, trainer: Trainer, module: TrainModule, metrics: dict[str, float]) -> None:
        """After a validation pass, with ``val/...`` metrics reduced over all ranks (the same on every
        rank; after the sanity pass its metrics, not logged). Lightning's shape ``on_validation_end(self, trainer,
        module)`` works too."""

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last step of an epoch (its 0-based number: ``run_of(trainer).epoch``)."""

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After training ended (normally or by a stop request), the final validation and save.
        Not after a preemption signal: that run saves and exits, to be resumed."""

    def on_save_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """While a checkpoint is saved, on rank 0 (which writes its small files; Lightning: every
        rank). ``checkpoint`` holds ``step`` and ``epoch``; keys added to it are saved (the types
        `state_dict` may hold) and given back to `on_load_checkpoint`."""

    def on_load_checkpoint(self, trainer: Trainer, module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """On resume, on every rank, before `load_state_dict`: the dict ``on_save_checkpoint``
        filled (empty for a checkpoint saved without it)."""

    # ----- Lightning's other hooks (no-ops; where each fires: trainer/api/hook_table.py) -------------------
    #: True for callbacks that act on logged metrics (early stopping, checkpointing): their
    #: ``on_train_epoch_end`` runs after the module's, so they see what it logged (Lightning's rule)
    watches_metrics: bool = False

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """At the start of every call (``stage``: fit, validate, test, predict), after the datamodule's ``setup``."""

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        """At the end of every call that finished without an error."""

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        """A call failed with ``exception`` on this rank (it is raised again afterwards)."""

    def on_sanity_check_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the sanity validation (``trainer.num_sanity_val_steps``)."""

    def on_sanity_check_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the sanity validation."""

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        """After the sanity check, before the first training epoch."""

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last step, the final validation and the last save."""

    def on_before_zero_grad(self, trainer: Trainer, module: TrainModule, optimizer: Any) -> None:
        """Before the gradients are zeroed (after the first micro-batch's forward of each step)."""

    def on_before_backward(self, trainer: Trainer, module: TrainModule, loss: Any) -> None:
        """Before each backward."""

    def on_after_backward(self, trainer: Trainer, module: TrainModule) -> None:
        """After each backward."""

    def on_before_optimizer_step(self, trainer: Trainer, module: TrainModule, optimizer: Any) -> None:
        """Gradients synced and unscaled, not clipped yet; before the optimizer steps. fp16: not called
        on a step known to be skipped for an overflow (see ``TrainModule.on_before_optimizer_step``)."""

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before a validation pass (the sanity pass too)."""

    def on_validation_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        """Before each validation batch of this rank."""

    def on_test_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before ``Trainer.test``'s pass."""

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After ``Trainer.test``'s pass."""

    def on_test_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first test batch."""

    def on_test_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last test batch."""

    def on_test_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        """Before each test batch of this rank."""

    def on_test_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        """After each test batch of this rank."""

    def on_predict_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before ``Trainer.predict``'s pass."""

    def on_predict_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After ``Trainer.predict``'s pass."""

    def on_predict_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        """Before the first predict batch."""

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        """After the last predict batch."""

    def on_predict_batch_start(self, trainer: Trainer, module: TrainModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        """Before each predict batch of this rank."""

    def on_predict_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        """After each predict batch of this rank."""

    # ----- stopping -------------------------------------------------------------------------------------
    def stop_needs_agreement(self, step: int) -> bool:
        """True on the steps where this callback may request a stop for a reason that can differ
        between ranks. It must depend on ``step`` alone (every rank answers the same), and be cheap:
        it is asked after every step. Default: False (the callback's stop decisions are the same on
        every rank, or it never stops)."""
        return False

    # ----- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this callback (default: nothing)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


def run_of(trainer: Trainer) -> RunView:
    """The read-only view of the run ``trainer`` is running on this rank (for callbacks; see
    `Callback` and `RunView`)."""
    view = getattr(trainer, "_run_view", None)
    if view is None:
        raise RuntimeError("this trainer is not running a fit or validate on this process")
    return view


def attach_module(callback: Callback, module: Any) -> None:
    """Let ``callback.log`` reach ``module`` (weakly: the callback outlives the run)."""
    callback.__dict__["_logging_module"] = weakref.ref(module) if module is not None else None


def _logging_module(callback: Callback, name: str) -> Any:
    reference = callback.__dict__.get("_logging_module")
    module = reference() if reference is not None else None
    if module is None:
        raise RuntimeError(f"{type(callback).__name__}.log({name!r}) outside a run: a callback logs from its hooks "
                           "while fit / validate / test runs")
    return module
