"""The Callback interface: code that watches (and may stop) a run without being part of the model.

Where each hook fires, in ``Trainer.fit`` (the module's hook of the same name always runs first,
then the callbacks' in the order they were given)::

    restore a checkpoint (trainer.resume): callback.load_state_dict(state) for each callback
    module.on_fit_start();              callback.on_fit_start(run)
    for epoch in epochs:
        for step in the epoch's optimizer steps:          # step counts from 1
            forward / backward / optimizer step
            module.on_train_step_end(step, metrics);  callback.on_train_step_end(run, step, metrics)
            every val_every_n_steps:
                validation pass
                module.on_validation_end(metrics);  callback.on_validation_end(run, metrics)
            checkpoint if due (saves callback.state_dict() of each callback)
            stop here if a callback called run.request_stop(reason)        # every rank together
        module.on_train_epoch_end(epoch);   callback.on_train_epoch_end(run, epoch)   # not for an epoch a stop cut short
    final validation (unless this step validated), save_last      # also after a stop
    module.on_fit_end();                callback.on_fit_end(run)

``Trainer.validate`` calls only ``on_validation_end``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.loop import _Run


class Callback:
    """Base class of callbacks: every hook is a no-op; override the ones you need.

    Every hook runs on every rank, after the module's hook of the same name (the order is in
    ``trainer/callbacks/base.py``'s docstring and in ``trainer/module.py``). ``run`` is the rank's
    training run; a callback may use:

    - ``run.trainer`` (its settings, e.g. ``log_every_n_steps``), ``run.module``, ``run.optimizer``
      (a list under manual optimization with several optimizers),
      ``run.lr_scheduling`` (its ``configs``: an ``LRSchedulerConfig`` per scheduler), ``run.step``,
      ``run.epoch``, ``run.rank``, ``run.run_dir``;
    - ``run.log(metrics)``: record ``{name: float}`` at the current step with the run's loggers
      (they exist on rank 0 only; other ranks' calls write nothing);
    - ``run.request_stop(reason)``: end training at the end of the current step, with a final
      validation and ``save_last`` as at a normal end. The log names the callback and the reason.

    **Stopping on every rank together.** A decision computed from the metrics the hooks receive is
    already the same on every rank (they are reduced over all ranks). A decision that can differ
    between ranks (wall-clock time, a file on a local disk) must be taken in ``on_train_step_end``
    on steps for which :meth:`stop_needs_agreement` returns True: on those steps only, the trainer
    agrees with one tiny all-reduce and stops every rank if any asked. Other steps make no
    collective, so a rank-local request on them would stop one rank alone and hang the others.

    **Checkpoints.** :meth:`state_dict` is saved (from rank 0) with every checkpoint and given back to
    :meth:`load_state_dict` on resume, before ``on_fit_start``. It must hold only what
    ``torch.load(weights_only=True)`` reads: numbers, strings, None, bools, lists, dicts and tensors.
    """

    @property
    def state_key(self) -> str:
        """The name this callback's state is saved under (default: the class name)."""
        return type(self).__qualname__

    # ----- hooks ---------------------------------------------------------------------------------------
    def on_fit_start(self, run: _Run) -> None:
        """The model is wrapped, the optimizer built and a checkpoint restored; no step ran yet."""

    def on_train_step_end(self, run: _Run, step: int, metrics: dict[str, float] | None) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds the reduced training metrics
        on logging steps (``trainer.log_every_n_steps``) and is None on the others (reading a device
        value there would add a host sync to the step)."""

    def on_validation_end(self, run: _Run, metrics: dict[str, float]) -> None:
        """After a validation pass, with ``val/...`` metrics reduced over all ranks (the same on every rank)."""

    def on_train_epoch_end(self, run: _Run, epoch: int) -> None:
        """After the last step of epoch ``epoch`` (0-based)."""

    def on_fit_end(self, run: _Run) -> None:
        """After training ended (normally or by a stop request), the final validation and save.
        Not after a preemption signal: that run saves and exits, to be resumed."""

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
        """Restore what :meth:`state_dict` returned."""
