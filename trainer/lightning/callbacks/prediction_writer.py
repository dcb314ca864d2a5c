"""Lightning's ``lightning.pytorch.callbacks.prediction_writer``: ``BasePredictionWriter``, a callback
that hands ``Trainer.predict``'s outputs to your own writing code, driven by the predict hooks."""

from __future__ import annotations

from typing import Any, Sequence

from trainer.api.callback import Callback
from trainer.lightning.utilities.exceptions import MisconfigurationException

#: Lightning's ``write_interval`` values: when the writer is called
WRITE_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Subclass it and override ``write_on_batch_end`` (``write_interval="batch"``: after each predict
    batch of this rank) and / or ``write_on_epoch_end`` (``"epoch"``: once, after this rank's last
    batch, with this rank's outputs in batch order); ``"batch_and_epoch"`` calls both.

    ``batch_indices`` (the samples' indices in the dataset, Lightning's) is None here for each batch:
    the predict set is read in dataset order, and ``batch_idx`` is the batch's index in the whole set."""

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in WRITE_INTERVALS:
            raise MisconfigurationException(f"`write_interval` should be one of {list(WRITE_INTERVALS)}.")
        self.interval = write_interval
        self._predictions: list[Any] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Sequence[int] | None,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Write one batch's prediction (override it for ``write_interval="batch"``)."""
        raise NotImplementedError()

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        """Write this rank's predictions of the pass (override it for ``write_interval="epoch"``)."""
        raise NotImplementedError()

    def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._predictions = []

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self.interval in ("epoch", "batch_and_epoch"):
            self._predictions.append(outputs)
        if self.interval in ("batch", "batch_and_epoch"):
            self.write_on_batch_end(trainer, pl_module, outputs, None, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval in ("epoch", "batch_and_epoch"):
            predictions, self._predictions = self._predictions, []
            self.write_on_epoch_end(trainer, pl_module, predictions, [[None] * len(predictions)])


__all__ = ["BasePredictionWriter"]
