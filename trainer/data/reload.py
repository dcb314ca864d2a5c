"""The data hooks read again during a fit (Lightning's ``reload_dataloaders_every_n_epochs``): the new
loader replaces the old one in the run's data; the batch settings the run resolved stay (they fix the
global batch), so a reloaded loader that disagrees with them is refused with a line naming both.

The hooks run under a seed every rank shares (derived from ``trainer.seed`` and the epoch), so every
rank reads the same datasets and the global-batch plan stays the same on any world size.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torch.utils.data import IterableDataset

from trainer.data.batch_sampler import BatchSamplerStream
from trainer.data.loader_reading import data_hook_seed
from trainer.data.user_loader import _collate, read_loader
from trainer.runtime.seeding import seeded

if TYPE_CHECKING:
    from trainer.data.user_loader import RunData


def reload_train(data: RunData, epoch: int) -> None:
    """``train_dataloader()`` (or ``train_dataset()``) again, for ``epoch``; the new data replaces the old."""
    hooks, trainer, where = data.hooks, data.trainer, data.hooks.where["train"]
    with seeded(data_hook_seed(trainer.seed, epoch)):
        loader = data.returned["train"] = hooks.train_dataloader()
        dataset = None if loader is not None else hooks.train_dataset()
    if loader is None:
        data.set_train(None, dataset)
        return
    new = read_loader(loader, where, stream_ok=True, batch_sampler_ok=True)
    what = f"reload_dataloaders_every_n_epochs: {where} at epoch {epoch}"
    if isinstance(new.dataset, IterableDataset) or isinstance(data.train_set(), IterableDataset):
        raise ValueError(f"{what}: a streaming dataset (an IterableDataset) cannot be reloaded here (its stream "
                         "position is part of the run's state); give a map-style dataset or reload_dataloaders_"
                         "every_n_epochs=0")
    batch = data.batch
    if new.batch_sampler is not None:
        stream = BatchSamplerStream(new.batch_sampler, len(new.dataset), trainer.seed, "train", where)
        if stream.batch_length != batch.global_batch_size:
            raise ValueError(f"{what} gives batches of {stream.batch_length}, the run's global batch is "
                             f"{batch.global_batch_size}: keep the global batch over a fit")
        new.batch_size = batch.batch_size
        data._batch_stream = stream
    else:
        data._batch_stream = None
    given = {"batch_size": new.batch_size, "drop_last": new.drop_last, "num_workers": new.options.num_workers,
             "pin_memory": new.options.pin_memory}
    for name, value in given.items():
        if value != getattr(batch, name):
            raise ValueError(f"{what} returns a DataLoader with {name}={value!r}, the run's is "
                             f"{getattr(batch, name)!r}: the batch settings are fixed over a fit (they make the "
                             f"global batch); return loaders with {name}={getattr(batch, name)!r}")
    data.train_options = dataclasses.replace(new.options, num_workers=batch.num_workers, pin_memory=batch.pin_memory)
    data.train_collate = _collate(data.module, new.collate_fn, where)
    data.set_train(new, new.dataset)


def reload_val(data: RunData, epoch: int) -> None:
    """``val_dataloader()`` (or ``val_dataset()``) again, for ``epoch``; the new data replaces the old."""
    data.read_val(data.val_hook(epoch), epoch)
    data.forget_loader("val")
