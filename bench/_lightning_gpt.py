"""bench/ddp_overhead.py's Lightning contender (its own file: only its workers import Lightning)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from _ddp_modules import stamp
from trainer.recipes.gpt import GPT


class LitGPT(L.LightningModule):
    def __init__(self, stamps: str, model_args: dict):
        super().__init__()
        self.stamps = stamps
        self.model = GPT(vocab_size=256, **model_args)

    def training_step(self, batch, batch_idx):
        if self.global_step == 0 and batch_idx == 0 and self.global_rank == 0:
            stamp(self.stamps, "first")
        inputs, targets = batch
        loss = F.cross_entropy(self.model(inputs).flatten(0, 1), targets.flatten())
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def on_train_end(self):
        if self.global_rank == 0:
            stamp(self.stamps, "last")
