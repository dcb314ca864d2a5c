"""Whose batch transfer hooks run with a DataModule, as Lightning decides it: the DataModule's only where
it defines its own (a recorder set on the instance around the base's hook is none: Lightning's
``is_overridden`` reads through ``functools.partial``, ``functools.wraps`` and ``Mock(wraps=)``), else
the module's. The same program under Lightning and the mirror records the same calls, and
``is_overridden`` answers as Lightning's on each kind of wrapper."""

from __future__ import annotations

import functools
from unittest.mock import Mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

TRANSFER = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             num_sanity_val_steps=0, max_epochs=1, limit_val_batches=0)


def program(pl, own_hook: bool, called: list):
    """A module and a DataModule whose transfer hooks record their calls in ``called``."""

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            called.append(("module", "on_before_batch_transfer", dataloader_idx))
            return batch

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

        if own_hook:
            def on_after_batch_transfer(self, batch, dataloader_idx):
                called.append(("datamodule", "on_after_batch_transfer", dataloader_idx))
                return batch

    data = Data()
    for name in TRANSFER:  # recorders around whatever the instance has (Lightning's hook tests do this)
        def record(hook, fn, *args):
            called.append(("recorder", hook, args[-1]))
            return fn(*args)

        wrapped = functools.partial(record, name, getattr(data, name))
        functools.update_wrapper(wrapped, getattr(data, name))
        setattr(data, name, wrapped)
    return Module(), data


@pytest.mark.parametrize("own_hook", [False, True])
def test_same_transfer_hook_calls_as_lightning(tmp_path, own_hook):
    pl = pytest.importorskip("lightning.pytorch")
    from trainer.lightning import pytorch as mirror

    theirs, ours = [], []
    module, data = program(pl, own_hook, theirs)
    pl.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "theirs"), **QUIET).fit(module, datamodule=data)
    module, data = program(mirror, own_hook, ours)
    mirror.Trainer(default_root_dir=str(tmp_path / "ours"), **QUIET).fit(module, datamodule=data)
    assert ours == theirs
    expected = [("module", "on_before_batch_transfer", 0)]
    if own_hook:  # the DataModule's own hook runs (through its recorder); the others stay the module's
        expected += [("recorder", "on_after_batch_transfer", 0), ("datamodule", "on_after_batch_transfer", 0)]
    assert ours == expected * 2


def test_is_overridden_reads_through_wrappers_as_lightning():
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.utilities.model_helpers import is_overridden as theirs

    from trainer.lightning import pytorch as mirror
    from trainer.lightning.utilities.model_helpers import is_overridden as ours

    def cases(side):
        class Own(side.LightningDataModule):
            def on_before_batch_transfer(self, batch, dataloader_idx):
                return batch

        plain, own = side.LightningDataModule(), Own()
        wrapped = functools.partial(lambda fn, *a: fn(*a), plain.on_before_batch_transfer)
        functools.update_wrapper(wrapped, plain.on_before_batch_transfer)
        found = []
        for instance, value in [(plain, None), (own, None), (side.LightningDataModule(), wrapped),
                                (side.LightningDataModule(), Mock(wraps=plain.on_before_batch_transfer)),
                                (side.LightningDataModule(), Mock()),
                                (side.LightningDataModule(), functools.partial(own.on_before_batch_transfer)),
                                (side.LightningDataModule(), lambda batch, idx: batch)]:
            if value is not None:
                instance.on_before_batch_transfer = value
            found.append(instance)
        return found

    lightning_answers = [theirs("on_before_batch_transfer", instance) for instance in cases(pl)]
    assert [ours("on_before_batch_transfer", instance) for instance in cases(mirror)] == lightning_answers
    assert lightning_answers == [False, True, False, False, False, True, True]
