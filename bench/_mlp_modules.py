"""What bench/hot_path_overhead.py trains: the data, the network and the optimizer, shared by every
contender (torch only: the hand-written loop imports neither the trainer nor Lightning)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


SAMPLES = 96_000  # 1,500 global batches of 64: a 1500-step run is one epoch
FEATURES, CLASSES, WIDTH = 64, 10, 256
LR = 1e-3


def dataset() -> TensorDataset:
    """Random inputs and labels, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=generator),
                         torch.randint(0, CLASSES, (SAMPLES,), generator=generator))


def mlp() -> nn.Module:
    """64 -> 256 -> 256 -> 256 -> 10, ReLU between; the same initial weights in every contender."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR)
