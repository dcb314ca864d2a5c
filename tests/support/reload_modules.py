"""A module whose data hooks draw new data at each call (``reload_dataloaders_every_n_epochs``): each
``train_dataloader()`` call draws a fresh dataset from the global random stream (seeded by the trainer
for every call alike on all ranks) and tags its samples with the epoch it was read at; validation
data likewise. Records which hook ran at which epoch and the tags each step trained on."""

from __future__ import annotations

import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule


class ReloadingModule(TrainModule):
    """Regression on data drawn anew at each data-hook call. ``train_sizes``: the dataset size per
    call (the last repeats); ``batch_sizes``: the loader's batch size per call (the last repeats)."""

    def __init__(self, train_sizes=(32,), batch_sizes=(8,), val_size: int = 12):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.05, momentum=0.9))
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.train_sizes, self.batch_sizes, self.val_size = list(train_sizes), list(batch_sizes), val_size
        self.calls: list[tuple[str, int, bool]] = []  # (hook, epoch, sanity checking)
        self.tags: list[list[int]] = []  # per step: the read epoch of its samples

    def _pick(self, values):
        n = sum(1 for hook, _, _ in self.calls if hook == "train")
        return values[min(n, len(values) - 1)]

    def train_dataloader(self):
        size, batch_size = self._pick(self.train_sizes), self._pick(self.batch_sizes)
        self.calls.append(("train", self.trainer.current_epoch, False))
        x = torch.randn(size, 4)
        y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1)
        tag = torch.full((size,), self.trainer.current_epoch)
        return DataLoader(TensorDataset(x, y, tag), batch_size=batch_size, shuffle=True)

    def val_dataloader(self):
        self.calls.append(("val", self.trainer.current_epoch, bool(self.trainer.sanity_checking)))
        x = torch.randn(self.val_size, 4)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True), torch.zeros(self.val_size)), batch_size=4)

    def training_step(self, batch, batch_idx):
        x, y, tag = batch
        self.tags.append(sorted(set(tag.tolist())))
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_mse", F.mse_loss(self.net(x), y))

    def on_fit_end(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(self.trainer.run_dir, f"reload_rank{rank}.json"), "w") as f:
            json.dump({"calls": self.calls, "tags": self.tags}, f)
        torch.save(self.net.state_dict(), os.path.join(self.trainer.run_dir, f"params_rank{rank}.pt"))


def reload_record(run_dir, rank: int = 0) -> dict:
    with open(os.path.join(str(run_dir), f"reload_rank{rank}.json")) as f:
        return json.load(f)


class SeveralValLoaders(TrainModule):
    """Regression validated on several loaders (``sizes`` samples each, batch sizes ``batch_sizes``);
    records each validation batch's ``(dataloader_idx, batch_idx, len)`` seen by the step and the batch
    hooks, and writes the last validation metrics."""

    def __init__(self, sizes=(10, 7), batch_sizes=(4, 3), as_dict: bool = False):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.05))
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.sizes, self.batch_sizes, self.as_dict = sizes, batch_sizes, as_dict
        self.steps_seen: list[tuple[int, int, int]] = []
        self.hooks_seen: list[tuple[int, int]] = []

    def train_dataset(self):
        x = torch.randn(32, 4)
        return TensorDataset(x, x.sum(dim=1, keepdim=True))

    def val_sets(self):
        generator = torch.Generator().manual_seed(5)
        sets = []
        for size in self.sizes:
            x = torch.randn(size, 4, generator=generator)
            sets.append(TensorDataset(x, x.sum(dim=1, keepdim=True) + 1))
        return sets

    def val_dataloader(self):
        loaders = [DataLoader(s, batch_size=b) for s, b in zip(self.val_sets(), self.batch_sizes)]
        return {f"set{i}": loader for i, loader in enumerate(loaders)} if self.as_dict else loaders

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.steps_seen.append((dataloader_idx, batch_idx, len(x)))
        self.log("val_mse", F.mse_loss(self.net(x), y))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.hooks_seen.append((dataloader_idx, batch_idx))

    def on_fit_end(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if "val_mse" in k}
        with open(os.path.join(self.trainer.run_dir, f"val_rank{rank}.json"), "w") as f:
            json.dump({"metrics": metrics, "steps": self.steps_seen, "hooks": self.hooks_seen,
                       "num_val_batches": list(self.trainer.num_val_batches)}, f)
        torch.save(self.net.state_dict(), os.path.join(self.trainer.run_dir, f"params_rank{rank}.pt"))


def val_record(run_dir, rank: int = 0) -> dict:
    with open(os.path.join(str(run_dir), f"val_rank{rank}.json")) as f:
        return json.load(f)
