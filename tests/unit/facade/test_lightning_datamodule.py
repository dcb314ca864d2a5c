"""The Lightning mirror's ``LightningDataModule``: ``from_datasets`` (its loaders, the stages it has no
dataset for left to the module in a fit) and ``str()``, Lightning's summary of the loaders."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.lightning import LightningDataModule, LightningModule, Trainer
from trainer.lightning.utilities.exceptions import MisconfigurationException


def test_from_datasets_gives_a_loader_per_dataset_and_refuses_the_others():
    train, val = TensorDataset(torch.zeros(6, 2)), [TensorDataset(torch.zeros(4, 2)), TensorDataset(torch.zeros(2, 2))]
    datamodule = LightningDataModule.from_datasets(train, val, batch_size=2)
    loader = datamodule.train_dataloader()
    assert isinstance(loader, DataLoader) and loader.batch_size == 2 and loader.dataset is train
    assert [len(one) for one in datamodule.val_dataloader()] == [2, 1]
    with pytest.raises(MisconfigurationException, match="`test_dataloader` must be implemented"):
        datamodule.test_dataloader()
    assert str(datamodule) == os.linesep.join(["{Train dataloader: size=6}", "{Validation dataloader: 1. size=4 ; 2. size=2}",
                                               "{Test dataloader: None}", "{Predict dataloader: None}"])


def test_a_fit_uses_the_datasets_given_and_calls_no_missing_hook(tmp_path):
    seen = []

    class Module(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            seen.append(batch[0].shape[0])
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    datamodule = LightningDataModule.from_datasets(TensorDataset(torch.ones(6, 2)), batch_size=3)
    trainer = Trainer(default_root_dir=str(tmp_path), max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), datamodule=datamodule)
    assert seen == [3, 3]
