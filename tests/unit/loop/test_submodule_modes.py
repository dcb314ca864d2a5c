"""A submodule the user put in eval mode (a frozen part) trains in eval mode and stays so after fit
and after its validation, as under Lightning; the rest of the module trains in training mode."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.lightning import LightningModule, Trainer


class _Frozen(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer, self.frozen = torch.nn.Linear(2, 1), torch.nn.Dropout(0.5)
        self.frozen.eval()
        self.seen: list[tuple[bool, bool, str]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.layer.training, self.frozen.training, "train"))
        return self.layer(self.frozen(batch[0])).sum()

    def validation_step(self, batch, batch_idx):
        self.seen.append((self.layer.training, self.frozen.training, "val"))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)


def test_a_frozen_submodule_keeps_its_mode(tmp_path):
    module = _Frozen()
    Trainer(default_root_dir=str(tmp_path), max_epochs=2, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0).fit(module)
    assert set(module.seen) == {(True, False, "train"), (False, False, "val")}
    assert [s[2] for s in module.seen] == ["train", "train", "val"] * 2  # (the second epoch after a validation)
    assert module.layer.training and not module.frozen.training
