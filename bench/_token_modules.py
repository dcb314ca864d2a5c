"""The hot-path benchmark's workload: a tiny next-token model on sequences whose loss is a mean over
tokens (``loss_normalization=tokens``), importable by spawned workers (bench/hot_path.py)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule


class TokenCounts(TrainModule):
    """Embedding + head over 12-token sequences; ``num_tokens`` a Python int (no device copy per
    micro-batch); stages for the pipeline. ``fused=True``: a fused AdamW, which skips an fp16
    overflow on a device flag (no host read); else SGD (one host read per fp16 step)."""

    def __init__(self, fused: bool = False):
        optimizer = partial(torch.optim.AdamW, lr=0.01, fused=True) if fused else partial(torch.optim.SGD, lr=0.1)
        super().__init__(optimizer=optimizer)
        torch.manual_seed(0)
        self.embed = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11)

    def train_dataset(self):
        generator = torch.Generator().manual_seed(3)
        return TensorDataset(torch.randint(0, 11, (40, 12), generator=generator))

    def training_step(self, batch, batch_idx):
        return self.pipeline_loss(self.head(self.embed(self.pipeline_input(batch))), batch)

    def pipeline_layers(self):
        return [self.embed, self.head]

    def pipeline_input(self, batch):
        return batch[0][:, :-1]

    def pipeline_loss(self, logits, batch):
        tokens = batch[0]
        loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
        return {"loss": loss, "num_tokens": tokens.shape[0] * (tokens.shape[1] - 1)}
