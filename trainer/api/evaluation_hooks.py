"""The module's evaluation hooks: the modes a validation, test or predict pass puts the module in
(``on_validation_model_eval`` ...) and the notifications of those passes (``on_validation_start`` ...
``on_predict_batch_end``; no-ops unless overridden). A mixin of
`TrainModule`."""

from __future__ import annotations

from typing import Any


class EvaluationHooks:
    """Validation, test and predict hooks (TrainModule's)."""

    def on_validation_model_zero_grad(self) -> None:
        """Before a validation pass inside ``fit``: frees the gradients (Lightning's default)."""
        self.zero_grad(set_to_none=True)

    def on_validation_model_eval(self) -> None:
        """Puts the module in eval mode before a validation pass."""
        self.eval()

    def on_validation_model_train(self) -> None:
        """After a validation pass; by default the trainer puts back each submodule's mode as it was
        before (an override takes that over)."""

    def on_test_model_eval(self) -> None:
        """Puts the module in eval mode before ``Trainer.test``'s pass."""
        self.eval()

    def on_test_model_train(self) -> None:
        """After the test pass; by default each submodule's mode is put back."""

    def on_predict_model_eval(self) -> None:
        """Puts the module in eval mode before ``Trainer.predict``'s pass."""
        self.eval()

    def on_validation_start(self) -> None:
        """Before a validation pass (also the sanity pass), after ``on_validation_model_eval``."""

    def on_validation_end(self, metrics: dict[str, float]) -> None:
        """After a validation pass, with the metrics reduced over all ranks (after the sanity pass: its
        metrics, which are not logged). Lightning's shape ``on_validation_end(self)`` works too."""

    def on_validation_epoch_start(self) -> None:
        """Before the first batch of a validation pass."""

    def on_validation_epoch_end(self) -> None:
        """After the last batch of a validation pass, before its metrics are reduced (what it logs belongs to the pass)."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each validation batch of this rank."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each validation batch of this rank; ``outputs`` is what ``validation_step`` returned."""

    def on_test_start(self) -> None:
        """Before ``Trainer.test``'s pass."""

    def on_test_end(self) -> None:
        """After ``Trainer.test``'s pass and its metrics."""

    def on_test_epoch_start(self) -> None:
        """Before the first test batch."""

    def on_test_epoch_end(self) -> None:
        """After the last test batch, before the metrics are reduced."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each test batch of this rank."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each test batch of this rank."""

    def on_predict_start(self) -> None:
        """Before ``Trainer.predict``'s pass."""

    def on_predict_end(self) -> None:
        """After ``Trainer.predict``'s pass."""

    def on_predict_epoch_start(self) -> None:
        """Before the first predict batch."""

    def on_predict_epoch_end(self) -> None:
        """After the last predict batch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each predict batch of this rank."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each predict batch of this rank; ``outputs`` is what ``predict_step`` returned."""
