"""The validation data of a run, read from ``val_dataloader()`` / ``val_dataset()``: one loader, or
several (a list, tuple or dict of DataLoaders, Lightning's ``dataloader_idx`` 0, 1, ... in order).

Several loaders: each is read as a single one would be (its own batch size, sampler, workers and
``drop_last``) into a part of its own (``RunData.val_parts``), and each part plans its own global
validation batches (every sample of it once over the ranks), so each loader's metrics are the same on
any world size. The run's own ``val`` / ``val_set`` are then the first loader's (the run validates).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset

from trainer.data.batch_plan import SamplerStream
from trainer.data.loader_reading import _collate, check_map_style, read_loader
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.seeding import derive_seed, seeded

if TYPE_CHECKING:
    from trainer.data.user_loader import RunData

log = logging.getLogger(__name__)


def several_loaders(loader: Any) -> list[Any] | None:
    """The loaders of a list, tuple or dict of DataLoaders (in order), or None for a single one."""
    if isinstance(loader, dict):
        return list(loader.values())
    if isinstance(loader, (list, tuple)):
        return list(loader)
    return None


def read_val(data: RunData, val_loader: Any, epoch: int | None = None) -> None:
    """Set ``data``'s validation data from ``val_loader`` (see the module docstring)."""
    where = data.hooks.where["val"]
    loaders = several_loaders(val_loader)
    data.val_parts = None
    if loaders is None:
        _read_one(data, val_loader, epoch, where)
        return
    if not loaders:
        raise ValueError(f"{where} returned no DataLoader (an empty {type(val_loader).__name__}); return at least one, "
                         "or None for no validation")
    parts = []
    for index, loader in enumerate(loaders):
        part = copy.copy(data)
        part._loaders, part.val_parts = {}, None  # (its own loader cache)
        _read_one(part, loader, epoch, f"{where}[{index}]")
        parts.append(part)
    _read_one(data, loaders[0], epoch, f"{where}[0]")
    data.val_parts = parts


def _read_one(data: RunData, val_loader: Any, epoch: int | None, val_where: str) -> None:
    hooks, seed, skip_val = data.hooks, data.trainer.seed, data._skip_val
    data.val = read_loader(val_loader, val_where, stream_ok=True, limit=(
        "limit_val_batches", getattr(data.trainer, "limit_val_batches", None))) if val_loader is not None else None
    with seeded(derive_seed(seed, "data", "val", *(() if epoch is None else (epoch,)))):
        data.val_set = data.val.dataset if data.val is not None else (None if skip_val else hooks.val_dataset())
    val = data.val
    if val is not None:
        if val.drop_last and isinstance(data.val_set, IterableDataset):
            raise ValueError(f"{val_where}: drop_last=True cannot be honoured for a stream (an IterableDataset): "
                             "validation covers every sample exactly once over the ranks; remove drop_last")
        if val.options.persistent_workers and isinstance(data.val_set, IterableDataset):
            raise ValueError(f"{val_where}: persistent_workers=True cannot be honoured for a stream (an "
                             "IterableDataset): its loader is built again each pass (the pass's shard order goes "
                             "to the workers); remove persistent_workers")
        data.val_batch_size, data.val_options = val.batch_size, val.options
        data.val_collate = _collate(data.module, val.collate_fn, val_where)
        data._val_stream = (SamplerStream(val.sampler, len(data.val_set), seed, "val", val_where)
                            if val.sampler is not None else None)
    elif data.val_set is not None:
        check_map_style(data.val_set, "val_dataset()", stream_ok=True)
        # As the training data is loaded (data.batch_size, the train loader's collate_fn and workers).
        data.val_batch_size, data.val_options, data.val_collate = (data.batch.batch_size, data.train_options,
                                                                  data.train_collate)
        if isinstance(data.val_set, IterableDataset) and data.train_options.persistent_workers:
            # A stream's loader is built again each pass; the setting still holds for the training loader.
            rank_zero_warn(log, "persistent_workers=True (%s) does not apply to the validation stream of "
                           "val_dataset(): its loader is built again each pass; to keep workers alive, give "
                           "validation a map-style dataset", hooks.where["train"])
            data.val_options = dataclasses.replace(data.train_options, persistent_workers=False)
