"""A tiny classifier on generated data, for quick checks: ``python train.py recipe=mlp``.

The data are Gaussian clusters drawn from a fixed seed, so every process and every run sees the
same dataset without any download.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule


def make_clusters(num_samples: int, num_features: int, num_classes: int, seed: int, split: int) -> TensorDataset:
    """``num_samples`` points around ``num_classes`` centres (centres ~ N(0, 1), noise 1.0). The
    centres depend on ``seed`` only; ``split`` draws a different sample (train 0, validation 1)."""
    centres = torch.randn(num_classes, num_features, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1 + split)
    labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
    features = centres[labels] + torch.randn(num_samples, num_features, generator=generator)
    return TensorDataset(features, labels)


class MLPClassifier(TrainModule):
    """Two hidden layers, cross-entropy; logs accuracy next to the loss."""

    def __init__(
        self,
        optimizer=None,
        scheduler=None,
        num_features: int = 20,
        num_classes: int = 4,
        hidden: int = 64,
        num_samples: int = 2048,
        val_samples: int = 512,
        data_seed: int = 1234,
    ):
        super().__init__(optimizer, scheduler)
        # The model's settings go into checkpoints and loggers (MLPClassifier.load_from_checkpoint
        # rebuilds it from them); the factories are the training run's, not the model's.
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        for name, value in (("num_features", num_features), ("num_classes", num_classes), ("hidden", hidden),
                            ("num_samples", num_samples)):
            if value < 1:
                raise ValueError(f"module.{name} must be >= 1, got {value}")
        self.num_features, self.num_classes = num_features, num_classes
        self.num_samples, self.val_samples, self.data_seed = num_samples, val_samples, data_seed
        self.net = nn.Sequential(
            nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def train_dataset(self):
        return make_clusters(self.num_samples, self.num_features, self.num_classes, self.data_seed, split=0)

    def val_dataset(self):
        if self.val_samples < 1:
            return None
        return make_clusters(self.val_samples, self.num_features, self.num_classes, self.data_seed, split=1)

    def _step(self, batch):
        features, labels = batch
        logits = self.net(features)
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return {"loss": loss, "accuracy": accuracy}

    def training_step(self, batch, batch_idx):
        return self._step(batch)

    def validation_step(self, batch, batch_idx):
        return self._step(batch)
