"""A small conv net with batch norm on handwritten digits: ``python train.py recipe=cnn``.

The data are scikit-learn's 8x8 digits (1,797 images, 10 classes), which ship inside the
scikit-learn package: no download. The train/validation split is a permutation drawn from
``data_seed``, so every process and every run gets the same split.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule


@functools.lru_cache(maxsize=4)
def digits_split(data_seed: int, val_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    """(train, validation) datasets of images ``(1, 8, 8)`` scaled to [0, 1] and labels 0-9.
    Cached: ``train_dataset`` and ``val_dataset`` both ask for it."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # a clear message rather than a bare ModuleNotFoundError
        raise ImportError(
            "recipe=cnn needs scikit-learn (it ships the digits data): pip install scikit-learn"
        ) from error
    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(data_seed))
    num_val = int(round(len(labels) * val_fraction))
    val, train = order[:num_val], order[num_val:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    # No conv bias: the batch norm's shift replaces it.
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU()
    )


class DigitsCNN(TrainModule):
    """Conv-BN-ReLU x 2, max-pool to 4x4, conv-BN-ReLU, global average pool, linear; cross-entropy.

    Batch norm makes it the recipe to try ``trainer.strategies.sync_batchnorm`` with: under DDP each rank's
    statistics come from its own micro-batch unless they are synchronised.

    Args:
        width: channels of the first two convolutions (the third has twice as many).
        val_fraction: share of the 1,797 images held out for validation.
        data_seed: seeds the train/validation split.
    """

    num_classes = 10

    def __init__(
        self, optimizer=None, scheduler=None, width: int = 16, val_fraction: float = 0.2, data_seed: int = 1234
    ):
        super().__init__(optimizer, scheduler)
        if width < 1:
            raise ValueError(f"module.width must be >= 1, got {width}")
        if not 0 < val_fraction < 1:
            raise ValueError(f"module.val_fraction must be in (0, 1), got {val_fraction}")
        self.width, self.val_fraction, self.data_seed = width, val_fraction, data_seed
        self.net: nn.Sequential | None = None

    def configure_model(self) -> None:
        # Built here, after the trainer seeded every rank: trainer.seed alone fixes the initial weights.
        if self.net is None:
            width = self.width
            self.net = nn.Sequential(
                conv_block(1, width),
                conv_block(width, width),
                nn.MaxPool2d(2),  # 8x8 -> 4x4
                conv_block(width, 2 * width),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(2 * width, self.num_classes),
            )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def train_dataset(self):
        return digits_split(self.data_seed, self.val_fraction)[0]

    def val_dataset(self):
        return digits_split(self.data_seed, self.val_fraction)[1]

    def _step(self, batch):
        images, labels = batch
        logits = self(images)
        return {"loss": F.cross_entropy(logits, labels), "accuracy": (logits.argmax(-1) == labels).float().mean()}

    def training_step(self, batch, batch_idx):
        return self._step(batch)

    def validation_step(self, batch, batch_idx):
        return self._step(batch)
