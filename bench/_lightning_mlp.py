"""bench/hot_path_overhead.py's Lightning contender (its own file: only its runs import Lightning)."""

from __future__ import annotations

import lightning as L
import torch.nn.functional as F

from _mlp_modules import adamw, mlp


class LitMLP(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        return F.cross_entropy(self.net(inputs), labels)

    def configure_optimizers(self):
        return adamw(self.parameters())
