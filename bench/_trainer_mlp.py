"""bench/hot_path_overhead.py's trainer contender, in its own file: the trainer's spawned workers
unpickle the module class by name, and only the trainer's runs import the trainer."""

from __future__ import annotations

import torch.nn.functional as F

from _mlp_modules import adamw, dataset, mlp
from trainer import TrainModule


class MLPModule(TrainModule):
    """The same network, data, loss and optimizer as the hand-written loop."""

    def __init__(self):
        super().__init__(optimizer=adamw)
        self.net = mlp()

    def train_dataset(self):
        return dataset()

    def training_step(self, batch, batch_idx):
        inputs, labels = batch
        return F.cross_entropy(self.net(inputs), labels)
