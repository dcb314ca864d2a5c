"""The module's step hooks: what one batch computes in each stage (``training_step``,
``validation_step``, ``test_step``, ``predict_step``). A mixin of
`TrainModule`."""

from __future__ import annotations

from typing import Any

import torch


class StepHooks:
    """The steps a module implements (TrainModule's)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """Return the mean loss of this micro-batch, or a dict with "loss" and more metrics
        (means over the micro-batch). With ``loss_normalization="tokens"`` also return
        "num_tokens", the count the loss is averaged over. None skips the micro-batch on one
        process (no backward; the step goes on); on several ranks it is an error (return
        ``loss * 0`` instead)."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step()")

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """Return the loss or a dict of metrics (means over the batch); the trainer weights them by
        batch size and reduces them across ranks into exact means over the validation set."""
        return None

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """``Trainer.test``'s step: return the loss or a dict of metrics (means over the batch), reduced
        like validation's into exact means over the test set, logged as ``test/<name>``. ``batch_idx``
        is the batch's index in the whole set (the same on any world size)."""
        raise NotImplementedError(f"{type(self).__name__} must implement test_step() for Trainer.test")

    def predict_step(self, batch: Any, batch_idx: int = 0, dataloader_idx: int = 0) -> Any:
        """``Trainer.predict``'s step: what to return for one batch (default: ``self(batch)``;
        ``dataloader_idx`` counts the loaders when there are several).
        Tensors in it are moved to the CPU and gathered to rank 0."""
        return self(batch)
