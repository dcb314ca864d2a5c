"""``LightningDataModule``: this trainer's `DataModule` (the same hooks, ``prepare_data``,
``setup(stage)``, ``*_dataloader``, meaning the same) with Lightning's extras: ``from_datasets`` and
``str(datamodule)``, the summary of its loaders."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sized
from typing import Any, Callable

from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.api.datamodule import DataModule
from trainer.api.errors import MisconfigurationException

_LOADERS = (("Train dataloader", "train_dataloader"), ("Validation dataloader", "val_dataloader"),
            ("Test dataloader", "test_dataloader"), ("Predict dataloader", "predict_dataloader"))


class LightningDataModule(DataModule):
    """A `DataModule` under Lightning's name, with ``from_datasets`` and Lightning's ``str()``."""

    @classmethod
    def from_datasets(cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None,
                      predict_dataset: Any = None, batch_size: int = 1, num_workers: int = 0,
                      **datamodule_kwargs: Any) -> LightningDataModule:
        """A datamodule whose loaders are ``DataLoader(dataset, batch_size, shuffle, num_workers,
        pin_memory=True)`` for each dataset given (a dataset, or a list / dict of them: one loader
        each), shuffled for training unless iterable. ``batch_size`` / ``num_workers`` and
        ``datamodule_kwargs`` go to ``cls(...)`` where its constructor takes them. A loader hook of a
        stage without a dataset raises, as Lightning's does (and the Trainer does not call it)."""
        accepted = inspect.signature(cls.__init__).parameters if cls.__init__ is not object.__init__ else {}
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        special = {k: v for k, v in (("batch_size", batch_size), ("num_workers", num_workers))
                   if takes_any or k in accepted}
        datamodule = cls(**datamodule_kwargs, **special)
        for (_, hook), datasets in zip(_LOADERS, (train_dataset, val_dataset, test_dataset, predict_dataset)):
            loader = (_loaders_of(datasets, batch_size, num_workers, shuffle=hook == "train_dataloader")
                      if datasets is not None else _not_implemented(hook))
            setattr(datamodule, hook, loader)
        return datamodule

    def __str__(self) -> str:
        """One line per stage: ``{Train dataloader: size=N}`` (``NA`` for a dataset without a length,
        ``1. size=N ; 2. size=M`` for several loaders, ``None`` where the stage has no loader)."""
        return os.linesep.join(f"{{{title}: {_describe(getattr(self, hook, None))}}}" for title, hook in _LOADERS)


def _loaders_of(datasets: Any, batch_size: int, num_workers: int, shuffle: bool) -> Callable[[], Any]:
    def one(dataset: Dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle and not isinstance(dataset, IterableDataset),
                          num_workers=num_workers, pin_memory=True)

    def loaders() -> Any:
        if isinstance(datasets, Mapping):
            return {key: one(dataset) for key, dataset in datasets.items()}
        if isinstance(datasets, (list, tuple)):
            return [one(dataset) for dataset in datasets]
        return one(datasets)

    return loaders


def _not_implemented(hook: str) -> Callable[[], Any]:
    def missing() -> Any:
        raise MisconfigurationException(f"`{hook}` must be implemented to be used with the Lightning Trainer "
                                         "(from_datasets was given no dataset for it)")

    missing.missing_stage = True  # (trainer/api/datamodule.py: not a hook the datamodule defines)
    return missing


def _describe(hook: Any) -> str:
    try:
        loader = hook()
    except Exception:  # (Lightning's summary: a hook that cannot give a loader shows None)
        return "None"
    if loader is None:
        return "None"
    if isinstance(loader, DataLoader):
        return _size(loader)
    several = list(loader.values()) if isinstance(loader, Mapping) else list(loader)
    return " ; ".join(f"{i}. {_size(item)}" if isinstance(item, DataLoader) else f"{i}. None"
                      for i, item in enumerate(several, start=1))


def _size(loader: DataLoader) -> str:
    return f"size={len(loader.dataset)}" if isinstance(loader.dataset, Sized) else "size=NA"


__all__ = ["LightningDataModule"]
