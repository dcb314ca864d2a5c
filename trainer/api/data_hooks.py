"""The module's data hooks: the datasets and DataLoaders of each stage (``train_dataset`` /
``train_dataloader`` ... ``predict_dataloader``), ``prepare_data``, ``collate_fn``, and the batch
transfer hooks (``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_batch_transfer``).
A mixin of `TrainModule`; a ``DataModule``'s hooks of the same names
replace these per stage (``trainer/api/datamodule.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import default_collate

from trainer.runtime.tensors import move_to_device

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset


class DataHooks:
    """Where a module's samples come from and how its batches reach the device (TrainModule's)."""

    def prepare_data(self) -> None:
        """Download or unpack data. Runs once per node (local rank 0) while the other ranks wait."""

    def train_dataset(self) -> Dataset:
        """The training dataset (called when ``train_dataloader()`` returns None): map-style, or an
        ``IterableDataset`` read as a stream (``data.stream_mode``; see ``trainer/data/streaming/``). The trainer
        builds the loader with a sampler that keeps every global batch the same whatever the world size
        and accumulation split. Like every data hook, it runs under the same seed on every rank, so
        data drawn from the global generators (``torch.randn``, an unseeded ``random_split``) is the
        same on every rank; the training hooks and the validation hooks get different seeds, so a
        split computed in both must pass ``generator=`` (or be computed once, e.g. in ``__init__``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataset() or train_dataloader()")

    def val_dataset(self) -> Dataset | None:
        """The validation dataset (called when ``val_dataloader()`` returns None; map-style or a stream),
        or None for no validation. Batched by ``data.batch_size``."""
        return None

    def train_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``train_dataset()``: a DataLoader. Taken from it:
        ``dataset``; ``batch_size`` = the per-rank micro-batch and ``drop_last`` (each must equal
        ``data.batch_size`` / ``data.drop_last`` where those are set; unset, the loader's are used);
        the order: ``shuffle=True`` is the trainer's seeded permutation, ``shuffle=False`` dataset
        order, a generator-free ``sampler`` (``WeightedRandomSampler`` ...) gives each epoch's index
        stream, drawn under the trainer's seed (after ``sampler.set_epoch(epoch)`` if it has one) and
        cut into the same global batches on any world size; ``collate_fn`` (an error if this module
        also overrides ``collate_fn()``); ``num_workers`` and ``pin_memory`` (agreeing with ``data.*``
        like the batch size), ``persistent_workers``, ``worker_init_fn`` (runs after the trainer
        seeded the worker), ``prefetch_factor``, ``timeout``, ``multiprocessing_context``,
        ``pin_memory_device``. Nothing else is read from the loader. A sampler that keeps random
        state of its own across epochs (rather than drawing from the global generators or from
        ``set_epoch``) gives another stream after a resume. Refused with an error saying what to change: a
        custom ``batch_sampler``, ``batch_size=None``, a ``generator`` on the loader or its sampler,
        a ``DistributedSampler`` (the trainer shards), ``in_order=False``; with an ``IterableDataset``
        (a stream, ``trainer/data/streaming/``) also ``persistent_workers=True``.
        Where both this and ``train_dataset()`` are defined, this one is used."""
        return None

    def val_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``val_dataset()``: a validation DataLoader. Its dataset is sharded over
        the ranks, every sample exactly once (no padding duplicates); its own ``batch_size`` (not
        ``data.batch_size``), ``collate_fn`` and worker settings are used. A shuffling or custom
        sampler is honoured: the samples validated on are its stream for the current epoch (drawn
        under the trainer's seed), each position once over the ranks. ``drop_last=True`` leaves out
        the short last batch of that order (what one process with this loader leaves out: the same
        samples on any world size). Refused: what ``train_dataloader`` refuses."""
        return None

    def test_dataset(self) -> Dataset | None:
        """The map-style dataset ``Trainer.test`` runs ``test_step`` over (when ``test_dataloader()``
        returns None), batched by ``data.batch_size``; None: no test data."""
        return None

    def test_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``test_dataset()``: a test DataLoader, read as ``val_dataloader()`` is
        (every sample once over the ranks, its own ``batch_size``, ``drop_last=True`` leaving out the
        short last batch); ``shuffle=True`` changes nothing (the metrics are means over the whole set);
        a custom sampler is refused."""
        return None

    def predict_dataset(self) -> Dataset | None:
        """The map-style dataset ``Trainer.predict`` runs ``predict_step`` over, in dataset order."""
        return None

    def predict_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``predict_dataset()``: a DataLoader whose ``batch_size`` forms the
        batches (in dataset order: ``shuffle=True`` or a sampler is refused)."""
        return None

    def collate_fn(self, samples: list) -> Any:
        """Turn a list of samples into a batch (default: torch's default_collate)."""
        return default_collate(samples)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch as loaded, before it moves to the device; return the batch to use."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device`` (tensors in nested lists, tuples and dicts)."""
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch on the device; return the batch to use."""
        return batch
