"""A transformers causal language model trained as transformers computes its loss:
``python train.py recipe=hf_causal_lm model.path=DIR``.

The batch is either the text recipes' pair ``(inputs, targets)`` (targets already the next tokens:
``data.path`` / ``data.tokens`` / ``data.source=hf``, ``recipes/text_data.py``) or transformers'
dict ``{"input_ids", "attention_mask", "labels"}``: labels default to the inputs with padding
(``attention_mask == 0``) set to -100, and are shifted by one inside (position t predicts token
t + 1); -100 is ignored. The loss is the mean over the counted tokens, and ``num_tokens`` is
returned, so ``trainer.loss_normalization=tokens`` weighs padded micro-batches exactly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainer.hf.source import tokenizer_files
from trainer.hf.base import HFModule
from trainer.recipes.text_module import TextRecipe

IGNORE_INDEX = -100  # transformers' (and torch's cross_entropy's) ignored label


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross entropy of ``logits`` (``[batch, time, vocab]``) against ``targets`` (already
    aligned: the next tokens), -100 ignored, in fp32; and the number of counted targets."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
    return loss, (targets != IGNORE_INDEX).sum()


def shifted_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The dict batch's labels (or its inputs with padding ignored), shifted to the next token: position
    t's target is label t + 1, the last position's is ignored."""
    labels = batch.get("labels")
    if labels is None:
        labels = batch["input_ids"]
        mask = batch.get("attention_mask")
        if mask is not None:
            labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


class HFCausalLM(TextRecipe, HFModule):
    """Next-token prediction with any ``AutoModelForCausalLM`` model (Llama, GPT-2, Qwen ...).

    Args:
        path / config / pretrained / blocks / tp_plan / export_dir / optimizer / scheduler: as ``HFModule``'s
            (``trainer/hf/base.py``).
        data_path / tokens / source / stream / tokenizer / hf / max_bytes / block_size / val_fraction:
            the text recipes' data (``trainer.recipes.gpt.GPTModule``); with ``source="hf"`` and no
            ``tokenizer``, the model directory's ``tokenizer.json``. The data's vocabulary must fit
            the model's ``vocab_size``.
    """

    auto_class = "AutoModelForCausalLM"

    def __init__(self, path: str | None = None, config: Any = None, optimizer: Any = None, scheduler: Any = None,
                 pretrained: bool = True, blocks: list[str] | None = None, tp_plan: dict | None = None,
                 export_dir: str | None = None, data_path: str | None = None, tokens: str | None = None, source: str | None = None,
                 stream: bool = False, tokenizer: str | None = None, hf: dict | None = None,
                 max_bytes: int = 1_000_000, block_size: int = 64, val_fraction: float = 0.05):
        HFModule.__init__(self, path, config, optimizer, scheduler, pretrained, blocks, tp_plan, export_dir)
        if source == "hf" and tokenizer is None:  # the model's own tokenizer, when its directory has one
            tokenizer = next((f for f in tokenizer_files(self.path) if f.endswith("tokenizer.json")), None)
        self.init_text_data(block_size, max_bytes, val_fraction, data_path, tokens, source, stream, tokenizer, hf)

    def train_dataset(self):
        vocab = self.vocab_size  # the data's (read on first use)
        if vocab > self.hf_config.vocab_size:
            raise ValueError(f"the data's vocabulary of {vocab} tokens exceeds the model's vocab_size="
                             f"{self.hf_config.vocab_size}; tokenize with the model's tokenizer")
        return super().train_dataset()

    def _loss(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if isinstance(batch, dict):
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
            targets = shifted_labels(batch)
        else:
            inputs, targets = batch
            logits = self.model(input_ids=inputs).logits
        loss, num_tokens = causal_lm_loss(logits, targets)
        return loss, num_tokens, targets

    def training_step(self, batch, batch_idx):
        loss, num_tokens, _ = self._loss(batch)
        return {"loss": loss, "num_tokens": num_tokens}

    def validation_step(self, batch, batch_idx):
        loss, _, targets = self._loss(batch)
        if isinstance(batch, dict):
            return {"loss": loss}
        return self.validation_outputs(loss, targets)

