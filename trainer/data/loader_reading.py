"""Reading one of the module's DataLoaders: what the trainer takes from it (``UserLoader``) and what
it refuses (see ``trainer/data/user_loader.py`` for the rules each stage applies)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler, default_collate
from torch.utils.data.distributed import DistributedSampler

from trainer.api.errors import MisconfigurationException
from trainer.data.loaders import LoaderOptions
from trainer.data.ready_batches import CycledLoaders, ReadyBatches, first_of, is_ready_batches, several_train_loaders
from trainer.runtime.seeding import derive_seed

if TYPE_CHECKING:
    from trainer.api.module import TrainModule


def data_hook_seed(seed: int, epoch: int | None = None) -> int:
    """The seed a fit's data hooks run under (``train_dataloader()``, ``val_dataloader()`` and the
    ``*_dataset()`` hooks), the same on every rank: one for training and validation, so what both
    draw at random agrees (an unseeded ``random_split`` of one set in each, a random dataset of the
    same shape: as under Lightning, whose sanity pass puts the random state back before
    ``train_dataloader()``); a reload for a later ``epoch`` has its own."""
    return derive_seed(seed, "data", "train") if not epoch else derive_seed(seed, "data", "train", epoch)


def in_dataset_order(loader: Any) -> Any:
    """A shallow copy of the DataLoader ``loader`` that reads its dataset in order (a
    ``SequentialSampler``): what ``trainer.train_dataloader`` / ``val_dataloaders`` show where the
    trainer reads it so (``overfit_batches``); anything else is returned as it is."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    ordered = copy.copy(loader)
    sampler = SequentialSampler(loader.dataset)
    # (a DataLoader refuses these attributes once built; the copy is a new loader, never iterated)
    object.__setattr__(ordered, "_iterator", None)
    object.__setattr__(ordered, "sampler", sampler)
    if loader.batch_size is not None:
        object.__setattr__(ordered, "batch_sampler", BatchSampler(sampler, loader.batch_size, loader.drop_last))
    return ordered


def check_map_style(dataset: Any, where: str, stream_ok: bool = False) -> None:
    """A clear error for a dataset the trainer cannot plan global batches over (before ``len()``); an
    ``IterableDataset`` is a stream (trainer/data/streaming/), for training and validation (``stream_ok``)."""
    if isinstance(dataset, IterableDataset):
        if stream_ok:
            return
        raise TypeError(f"{where} gave {type(dataset).__name__}, an IterableDataset: streaming datasets are supported "
                        "for training and validation, not here yet; give a map-style dataset (__getitem__ + __len__)")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"{where} gave {type(dataset).__name__}, which is not a map-style dataset "
                        "(it needs __getitem__ and __len__)")


@dataclass
class UserLoader:
    """What the trainer takes from one of the module's DataLoaders."""

    where: str  # "train_dataloader()" / "val_dataloader()"
    dataset: Any
    batch_size: int
    drop_last: bool
    shuffle: bool  # the trainer's seeded permutation (else dataset order or ``sampler``)
    sampler: Any  # a generator-free sampler whose index stream is the epoch's order, or None
    collate_fn: Callable[[list], Any]
    options: LoaderOptions
    batch_sampler: Any = None  # train_dataloader()'s own batch sampler: its batches are the global batches


def read_loader(loader: Any, where: str, stream_ok: bool = False, batch_sampler_ok: bool = False,
                limit: tuple[str, Any] | None = None) -> UserLoader:
    """Read a DataLoader returned by ``where``; raise for what cannot be honoured. ``batch_sampler_ok``:
    a custom batch sampler is taken (training: its batches are the global batches). ``limit``: the
    stage's ``(limit_*_batches name, value)``, for Lightning's error about a fraction of a loader without
    a length."""
    if not isinstance(loader, DataLoader):
        if limit is not None:
            _refuse_fraction_of_unsized(loader, where, *limit)
        if several_train_loaders(loader):  # (validation, test and predict read several loaders as parts)
            return UserLoader(where, ReadyBatches(CycledLoaders(loader), where), 1, False, False, None, first_of,
                              LoaderOptions())
        if not is_ready_batches(loader):
            raise TypeError(f"{where} must return a torch.utils.data.DataLoader, an iterable of ready batches (or "
                            f"None), got {type(loader).__name__}")
        return UserLoader(where, ReadyBatches(loader, where), 1, False, False, None, first_of, LoaderOptions())
    check_map_style(loader.dataset, where, stream_ok)
    custom = loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler
    if custom and batch_sampler_ok and not isinstance(loader.dataset, IterableDataset):
        if loader.generator is not None:
            raise ValueError(f"{where}: DataLoader(generator=...) cannot be honoured: the trainer draws the batch "
                             "sampler's batches under trainer.seed; remove generator= and set trainer.seed")
        return UserLoader(where, loader.dataset, 0, False, False, None, loader.collate_fn, _options(loader),
                          batch_sampler=loader.batch_sampler)
    if loader.batch_size is None:
        if loader.batch_sampler is not None:
            raise ValueError(
                f"{where}: a custom batch_sampler ({type(loader.batch_sampler).__name__}) cannot be honoured: the "
                "trainer forms global batches itself so they are the same on any world size; give the DataLoader "
                "batch_size=... (the per-rank micro-batch) and, for a custom order, sampler=..."
            )
        raise ValueError(f"{where}: DataLoader(batch_size=None) loads unbatched samples; give batch_size=... "
                         "(the per-rank micro-batch)")
    if type(loader.batch_sampler) is not BatchSampler:
        raise ValueError(f"{where}: a custom batch_sampler ({type(loader.batch_sampler).__name__}) cannot be honoured; "
                         "give batch_size=... and, for a custom order, sampler=...")
    if loader.generator is not None:
        raise ValueError(f"{where}: DataLoader(generator=...) cannot be honoured: the trainer draws the order and the "
                         "workers' seeds from trainer.seed (the same on every rank); remove generator= and set trainer.seed")
    if not getattr(loader, "in_order", True):
        raise ValueError(f"{where}: DataLoader(in_order=False) cannot be honoured: each step needs its micro-batches in "
                         "plan order; remove in_order=False")
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        raise ValueError(
            f"{where}: a DistributedSampler cannot be honoured: the trainer deals every global batch to the ranks "
            "itself (the same samples per step on any world size); use shuffle=True, or the sampler you would wrap"
        )
    if getattr(sampler, "generator", None) is not None:
        raise ValueError(
            f"{where}: the sampler {type(sampler).__name__} has its own generator, which cannot be honoured: the trainer "
            "draws the sampler's stream under trainer.seed (the same on every rank, again on resume); build it "
            "without generator= and set trainer.seed"
        )
    plain = getattr(sampler, "data_source", None) is loader.dataset
    shuffle = plain and type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
    if plain and type(sampler) is SequentialSampler or shuffle or isinstance(loader.dataset, IterableDataset):
        sampler = None  # dataset order, or the trainer's own permutation
    return UserLoader(where, loader.dataset, loader.batch_size, loader.drop_last, shuffle, sampler,
                      loader.collate_fn, _options(loader))


def _options(loader: DataLoader) -> LoaderOptions:
    workers = loader.num_workers
    return LoaderOptions(
        num_workers=workers,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers,
        worker_init_fn=loader.worker_init_fn,
        prefetch_factor=loader.prefetch_factor if workers > 0 else None,
        timeout=loader.timeout,
        multiprocessing_context=loader.multiprocessing_context,
        pin_memory_device=getattr(loader, "pin_memory_device", ""),
    )


def kept_samples(size: int, batch_size: int, drop_last: bool, where: str) -> int:
    """How many samples (of ``size``, in order) an evaluation loader covers: all, or with ``drop_last``
    all but the short last batch of its ``batch_size`` (as one process with that loader)."""
    if not drop_last:
        return size
    kept = size - size % batch_size
    if kept == 0:
        raise ValueError(f"{where}: drop_last=True with batch_size={batch_size} leaves none of the {size} samples; "
                         "lower the batch size or remove drop_last")
    return kept


def _collate(module: TrainModule, loader_collate: Callable[[list], Any] | None, where: str) -> Callable[[list], Any]:
    from trainer.api.module import TrainModule

    overridden = type(module).collate_fn is not TrainModule.collate_fn
    if loader_collate is first_of:  # ready batches: used as they are
        return first_of
    if loader_collate is None or loader_collate is default_collate:
        return module.collate_fn
    if overridden:
        raise ValueError(f"{where} gives collate_fn={getattr(loader_collate, '__name__', loader_collate)!r} and "
                         f"{type(module).__name__} overrides collate_fn(): keep one of them")
    return loader_collate


def _refuse_fraction_of_unsized(loader: Any, where: str, name: str, value: Any) -> None:
    """Lightning's error for a fraction (other than 0 and 1) of a loader that has no length."""
    if not isinstance(value, float) or value in (0.0, 1.0) or not hasattr(loader, "__iter__"):
        return
    try:
        len(loader)
        return
    except (TypeError, NotImplementedError):
        pass
    raise MisconfigurationException(
        f"{where} returned {type(loader).__name__}, which has no length (as an `IterableDataset`): "
        f"`Trainer({name})` must be `1.0` or an int (a count of batches), not the fraction {value}")
