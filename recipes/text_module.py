"""The data side of a text recipe's module, shared by recipe=gpt and recipe=llama: the ``data.*``
settings, the datasets and vocabulary they pick (``recipes/text_data.py``), and the validation
metrics (``val/loss`` in nats per token, ``val/bits_per_byte`` on every source).

Use: ``class LlamaModule(TextRecipe, TrainModule)``; call ``self.init_text_data(...)`` in ``__init__``, build the model with
``self.vocab_size`` in ``configure_model`` and return ``self.validation_outputs(loss, targets)``
from ``validation_step`` (and ``self.pipeline_eval_outputs(loss)`` from ``pipeline_loss``).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import torch
from torch.utils.data import Dataset

from trainer.recipes.text_data import TextData, check_settings, text_datasets


@functools.lru_cache(maxsize=1)
def _warn_no_pipeline_bpb() -> None:
    logging.getLogger(__name__).warning(
        "strategy=pipeline with token data: validation reports val/loss (nats per token) but not "
        "val/bits_per_byte; validate under another strategy for bits per byte")


class TextRecipe:
    """Mixin (before ``TrainModule``): a text recipe's data hooks and validation metrics."""

    def init_text_data(self, block_size: int, max_bytes: int, val_fraction: float, data_path: str | None = None,
                       tokens: str | None = None, source: str | None = None, stream: bool = False,
                       tokenizer: str | None = None, hf: dict | None = None) -> None:
        """Check the data settings (no data is read here: that happens on each rank, on first use)."""
        self.data_settings: dict[str, Any] = dict(path=data_path, tokens=tokens, source=source, stream=stream,
                                                  tokenizer=tokenizer, hf=hf)
        check_settings(**self.data_settings)
        if not 0 < val_fraction < 1:
            raise ValueError(f"module.val_fraction must be in (0, 1), got {val_fraction}")
        self.data_path, self.max_bytes, self.block_size, self.val_fraction = data_path, max_bytes, block_size, val_fraction
        self._text: TextData | None = None
        self._token_bytes: torch.Tensor | None = None  # on the model's device, for validation

    def text_data(self) -> TextData:
        """The data the settings pick (read once, on first use)."""
        if self._text is None:
            self._text = text_datasets(self.block_size, **self.data_settings, max_bytes=self.max_bytes,
                                       val_fraction=self.val_fraction)
        return self._text

    @property
    def vocab_size(self) -> int:
        """The data's vocabulary: 256 for bytes, the manifest's / tokenizer's for tokens."""
        return self.text_data().vocab_size

    def train_dataset(self) -> Dataset:
        return self.text_data().train

    def val_dataset(self) -> Dataset | None:
        return self.text_data().val

    def validation_outputs(self, loss: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """What ``validation_step`` returns for a batch whose mean target loss (nats) is ``loss``."""
        token_bytes = self.text_data().token_bytes
        if token_bytes is None:  # one byte per token: bits per byte is the loss in base 2
            return {"loss": loss, "bits_per_byte": loss / math.log(2)}
        # Tokens stand for different numbers of bytes: bits per byte = the targets' nats / the UTF-8
        # bytes they decode to (end-of-document: 0) / ln 2, weighted by those bytes so that the pass
        # reports sum(nats) / sum(bytes) / ln 2 exactly. Reading the byte count is one host read
        # per validation batch (never in training); a batch of only special tokens counts as 1 byte.
        if self._token_bytes is None or self._token_bytes.device != targets.device:
            self._token_bytes = torch.as_tensor(token_bytes, device=targets.device)
        num_bytes = max(int(self._token_bytes[targets].sum()), 1)
        self.log("val/bits_per_byte", loss.detach() * targets.numel() / num_bytes / math.log(2),
                 batch_size=num_bytes, sync_dist=True)
        return {"loss": loss}

    def pipeline_eval_outputs(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """``pipeline_loss``'s evaluation metrics (the stages cannot call ``self.log``)."""
        if self.text_data().token_bytes is not None:
            _warn_no_pipeline_bpb()
            return {"loss": loss}
        return {"loss": loss, "bits_per_byte": loss / math.log(2)}
