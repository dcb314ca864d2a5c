"""A transformers sequence classifier (BERT, RoBERTa, a decoder with a score head ...) trained as
transformers computes its loss: the config's ``problem_type`` (or, as transformers infers it, one
label: regression; integer labels: single-label; float label vectors: multi-label).

The batch is ``(input_ids, attention_mask, labels)`` (a ``TensorDataset``'s rows) or a dict with
those keys; the data comes from the module's data hooks (subclass and return your dataset from
``train_dataset`` / ``val_dataset``, or give a ``DataModule``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainer.hf.base import HFModule


def _fields(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    if isinstance(batch, dict):
        return batch["input_ids"], batch.get("attention_mask"), batch["labels"]
    input_ids, attention_mask, labels = batch
    return input_ids, attention_mask, labels


def problem_type(config: Any, labels: torch.Tensor) -> str:
    """transformers' choice: the config's ``problem_type``, else from the number and type of labels."""
    if getattr(config, "problem_type", None):
        return config.problem_type
    if config.num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


class HFSequenceClassification(HFModule):
    """Sequence classification with any ``AutoModelForSequenceClassification`` model. Logs
    ``accuracy`` for single-label classification.

    Args: as ``HFModule``'s (``trainer/hf/base.py``); ``num_labels`` etc. come from the config.
    """

    auto_class = "AutoModelForSequenceClassification"

    def _loss(self, batch: Any) -> dict[str, torch.Tensor]:
        input_ids, attention_mask, labels = _fields(batch)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        kind = problem_type(self.hf_config, labels)
        if kind == "regression":
            return {"loss": F.mse_loss(logits.squeeze(-1), labels.float().view(-1))}
        if kind == "multi_label_classification":
            return {"loss": F.binary_cross_entropy_with_logits(logits, labels.float())}
        loss = F.cross_entropy(logits.view(-1, self.hf_config.num_labels), labels.view(-1))
        return {"loss": loss, "accuracy": (logits.argmax(-1) == labels).float().mean()}

    def training_step(self, batch, batch_idx):
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        return self._loss(batch)
