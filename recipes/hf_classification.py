"""Any transformers sequence classifier (BERT, RoBERTa ...) from a local directory, on generated data:
``python train.py recipe=hf_sequence_classification model.path=DIR``.

The data are token sequences drawn from a fixed seed (identical in every process, nothing
downloaded), right-padded to ``seq_len`` with token 0 and an attention mask, labelled by their first
token (its id modulo the config's ``num_labels``): a task the model learns in a few dozen steps, to
check a model and a layout end to end. For your own data, subclass ``trainer.hf.HFSequenceClassification``
and return a dataset of ``(input_ids, attention_mask, labels)`` from ``train_dataset``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from trainer.hf import HFSequenceClassification


def make_sequences(num_samples: int, seq_len: int, vocab_size: int, num_labels: int, seed: int,
                   split: int) -> TensorDataset:
    """``num_samples`` rows of ``(input_ids, attention_mask, label)``: ids in ``1..vocab_size-1``, a
    random length of 2 to ``seq_len`` (the rest padding: id 0, mask 0), the label the first id modulo
    ``num_labels``. ``split`` draws a different sample from the same seed (train 0, validation 1)."""
    generator = torch.Generator().manual_seed(seed + split)
    ids = torch.randint(1, vocab_size, (num_samples, seq_len), generator=generator)
    lengths = torch.randint(2, seq_len + 1, (num_samples,), generator=generator)
    mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    return TensorDataset(ids * mask, mask, ids[:, 0] % num_labels)


class HFSequenceClassifierRecipe(HFSequenceClassification):
    """``HFSequenceClassification`` trained on ``make_sequences``' generated data.

    Args:
        path / config / pretrained / blocks / tp_plan / export_dir / optimizer / scheduler: as
            ``trainer.hf.HFModule``'s.
        num_samples / val_samples: generated training / validation rows (0 validation: none).
        seq_len: the rows' length in tokens, padding included (at most the model's
            ``max_position_embeddings``).
        data_seed: fixes the generated data, independently of ``trainer.seed``.
    """

    def __init__(self, path: str | None = None, config: Any = None, optimizer: Any = None, scheduler: Any = None,
                 pretrained: bool = True, blocks: list[str] | None = None, tp_plan: dict | None = None,
                 export_dir: str | None = None, num_samples: int = 512, val_samples: int = 128, seq_len: int = 16,
                 data_seed: int = 1234):
        super().__init__(path, config, optimizer, scheduler, pretrained, blocks, tp_plan, export_dir)
        labels = self.hf_config.num_labels
        if labels < 2 or getattr(self.hf_config, "problem_type", None) not in (None, "single_label_classification"):
            raise ValueError(f"the generated data are single-label classes, and the model's config has num_labels="
                             f"{labels}, problem_type={self.hf_config.problem_type!r}; use a config with num_labels "
                             ">= 2 and no other problem_type, or give your own data (subclass HFSequenceClassification)")
        longest = getattr(self.hf_config, "max_position_embeddings", seq_len)
        if not 2 <= seq_len <= longest:
            raise ValueError(f"module.seq_len={seq_len} must be between 2 and the model's max_position_embeddings="
                             f"{longest}")
        if num_samples < 1 or val_samples < 0:
            raise ValueError(f"module.num_samples={num_samples} must be >= 1 and module.val_samples={val_samples} >= 0")
        self.num_samples, self.val_samples, self.seq_len, self.data_seed = num_samples, val_samples, seq_len, data_seed

    def _rows(self, num_samples: int, split: int) -> TensorDataset:
        return make_sequences(num_samples, self.seq_len, self.hf_config.vocab_size, self.hf_config.num_labels,
                              self.data_seed, split)

    def train_dataset(self):
        return self._rows(self.num_samples, split=0)

    def val_dataset(self):
        return self._rows(self.val_samples, split=1) if self.val_samples else None
