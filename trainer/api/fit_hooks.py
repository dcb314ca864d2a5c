"""The module's set-up, training and checkpoint hooks: ``setup`` / ``teardown``, the callbacks it
brings (``configure_callbacks``), the notifications of a fit (``on_fit_start`` ... ``on_train_epoch_end``,
no-ops unless overridden) and ``on_save_checkpoint`` / ``on_load_checkpoint``. Where each fires:
``trainer/api/module.py``'s pseudocode; the order: ``trainer/api/hook_table.py``. A mixin of
`TrainModule`."""

from __future__ import annotations

from typing import Any

import torch


class FitHooks:
    """Set-up, tear-down, training notifications and checkpoint hooks (TrainModule's)."""

    def setup(self, stage: str) -> None:
        """At the start of every call on every rank, after ``prepare_data`` and the datamodule's
        ``setup`` and before ``configure_model``: ``stage`` is "fit", "validate", "test" or "predict".
        Runs under the trainer's seed, so layers built here are the same on every rank."""

    def teardown(self, stage: str) -> None:
        """At the end of every call that finished without an error, on every rank."""

    def configure_callbacks(self) -> Any:
        """Callbacks this module brings (a Callback or a list): added to ``Trainer(callbacks=...)`` at
        the start of each call; one of the same class as a Trainer callback replaces it."""
        return []

    def on_fit_start(self) -> None:
        """After the model is wrapped and the optimizer built, before the sanity check and the first step."""

    def on_fit_end(self) -> None:
        """After training stops, on every rank."""

    def on_train_start(self) -> None:
        """After the sanity check, before the first training epoch."""

    def on_train_end(self) -> None:
        """After the last training step, the final validation and the last save; before ``on_fit_end``."""

    def on_train_epoch_start(self) -> None:
        """Before the first step of an epoch."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        """Before each micro-batch's forward (per micro-batch, as Lightning; ``batch_idx`` counts them
        in the epoch). Lightning's ``return -1`` (skip the rest of the epoch) is refused with an error."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After each micro-batch's backward (the last one's: after the optimizer step, as Lightning);
        ``outputs`` is what ``training_step`` returned (device tensors)."""

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Before the gradients are zeroed: after the first micro-batch's forward of each step (Lightning's place)."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Before each backward; ``loss`` is what ``training_step`` returned (unscaled)."""

    def on_after_backward(self) -> None:
        """After each backward (gradients of a non-final micro-batch are not synced yet)."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The step's gradients are synced and unscaled (fp16), not clipped yet (as Lightning);
        the optimizer has not stepped. Not called on an fp16 step skipped for an overflow where the
        host knows it (optimizers that cannot skip on a device flag; logging steps otherwise); on
        other steps a fused optimizer skips on the device after this hook ran, since knowing
        earlier would cost a host sync every step."""

    def on_train_step_end(self, step: int, metrics: dict[str, float] | None) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds the reduced metrics on logging
        steps and None otherwise (no host sync on the other steps)."""

    def on_train_epoch_end(self, epoch: int) -> None:
        """After the last step of an epoch (only of an epoch that finished: a run that stops at
        ``max_steps`` mid-epoch does not end that epoch). Lightning's shape ``on_train_epoch_end(self)``
        works too."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """While a checkpoint is saved (rank 0, after the callbacks' hooks): ``checkpoint`` holds
        ``step`` and ``epoch`` (not the weights: they are written in the strategy's format); keys
        added are saved and given back to ``on_load_checkpoint``."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """On resume, on every rank, before the callbacks' hooks: the dict ``on_save_checkpoint`` filled."""
