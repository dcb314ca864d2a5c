"""Modules for the tests of Lightning's validation schedule and data reads (``val_check_interval``,
``check_val_every_n_epoch``, when ``val_dataloader()`` is read, ``overfit_batches``), written once for
Lightning and for ``trainer.lightning`` (``build(pl, ScheduleSteps)``, tests/support/lightning_loop_modules.py).
The class for our side is also defined at module level, so spawned ranks can import it."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

import trainer.lightning as ours
from tests.support.lightning_loop_modules import ModuleSteps


class Reversed(Sampler):
    """A custom sampler that is not a ``SequentialSampler``: the dataset from its last sample to its first."""

    def __init__(self, data_source: Any):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source) - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.data_source)


class ScheduleSteps(ModuleSteps):
    """`ModuleSteps` (16 training samples, batches of ``batch_size``) that records each read of
    ``val_dataloader()`` as ``("val_dataloader", current_epoch, sanity_checking)`` and each batch's
    first sample in ``self.batches[stage]``. Options: ``random``: both data hooks draw their data from
    the global generators (as Lightning's ``RandomDataset``), 16 samples each; ``sampler``: both
    loaders read through `Reversed`."""

    def __init__(self, batch_size: int = 2, **options: Any):
        super().__init__(batch_size, **options)
        self.batches: dict[str, list[list[float]]] = {"train": [], "val": []}

    def _loader(self, data: torch.Tensor, batch_size: int) -> DataLoader:
        dataset = TensorDataset(data)
        sampler = Reversed(dataset) if self.options.get("sampler") else None
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler)

    def train_dataloader(self):
        data = torch.randn(16, 2) if self.options.get("random") else torch.arange(32.0).view(16, 2) / 10
        return self._loader(data, self.batch_size)

    def val_dataloader(self):
        self.calls.append(("val_dataloader", self.current_epoch, bool(self.trainer.sanity_checking)))
        data = torch.randn(16, 2) if self.options.get("random") else torch.arange(10.0).view(5, 2) / 10
        return self._loader(data, self.options.get("eval_batch", 2))

    def training_step(self, batch, batch_idx):
        self.batches["train"].append(batch[0][0].tolist())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.batches["val"].append(batch[0][0].tolist())
        super().validation_step(batch, batch_idx)


Schedule = type("Schedule", (ScheduleSteps, ours.LightningModule), {"__module__": __name__})  # (picklable here)
