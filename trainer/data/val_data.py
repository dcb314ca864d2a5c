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
from trainer.data.loader_reading import _collate, check_map_style, data_hook_seed, in_dataset_order, read_loader
from trainer.runtime.rank_logging import rank_zero_user_warning, rank_zero_warn
from trainer.runtime.seeding import seeded

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
        if _read_one(data, val_loader, epoch, where):
            data.returned["val"] = in_dataset_order(val_loader)
        return
    if not loaders:
        raise ValueError(f"{where} returned no DataLoader (an empty {type(val_loader).__name__}); return at least one, "
                         "or None for no validation")
    parts, ordered = [], []
    for index, loader in enumerate(loaders):
        part = copy.copy(data)
        part._loaders, part.val_parts = {}, None  # (its own loader cache)
        ordered.append(_read_one(part, loader, epoch, f"{where}[{index}]"))
        parts.append(part)
    _read_one(data, loaders[0], epoch, f"{where}[0]", quiet=True)
    data.val_parts = parts
    if any(ordered):  # (trainer.val_dataloaders: each loader as it is read)
        shown = [in_dataset_order(loader) if reordered else loader for loader, reordered in zip(loaders, ordered)]
        data.returned["val"] = dict(zip(val_loader, shown)) if isinstance(val_loader, dict) else type(val_loader)(shown)


def _read_one(data: RunData, val_loader: Any, epoch: int | None, val_where: str, quiet: bool = False) -> bool:
    """Set ``data``'s validation data from one loader; returns whether its order was turned off
    (`_in_order_for_overfit`; ``quiet``: without the warning, given for the same loader already)."""
    hooks, seed, skip_val = data.hooks, data.trainer.seed, data._skip_val
    data.val = read_loader(val_loader, val_where, stream_ok=True, limit=(
        "limit_val_batches", getattr(data.trainer, "limit_val_batches", None))) if val_loader is not None else None
    with seeded(data_hook_seed(seed, epoch)):
        data.val_set = data.val.dataset if data.val is not None else (None if skip_val else hooks.val_dataset())
    reordered = _in_order_for_overfit(data, val_where, quiet)
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
    return reordered


def _in_order_for_overfit(data: RunData, val_where: str, quiet: bool) -> bool:
    """Under ``overfit_batches`` a fit validates in dataset order (as Lightning: its first batches):
    a validation loader's shuffling or sampler is turned off, with Lightning's warning."""
    trainer, val = data.trainer, data.val
    fitting = (getattr(trainer, "stage", None) or "fit") == "fit"
    if not (getattr(trainer, "overfit_batches", None) and fitting and val is not None
            and (val.shuffle or val.sampler is not None)):
        return False
    if not quiet:
        order = "shuffle=True" if val.shuffle else f"sampler={type(val.sampler).__name__}"
        rank_zero_user_warning(log, getattr(trainer, "lightning_warnings", False), (
            f"trainer.overfit_batches={trainer.overfit_batches}: you requested to overfit but enabled val dataloader "
            f"shuffling ({val_where} gives {order}); validation reads its data in dataset order"))
    data.val = dataclasses.replace(val, shuffle=False, sampler=None)
    return True
