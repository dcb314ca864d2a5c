"""The module's data hooks, read once per run on every rank: what a user's DataLoader says, which of
it the trainer honours, and which settings it refuses (nothing is dropped silently).

From ``train_dataloader()``: ``dataset``; ``batch_size`` is the per-rank micro-batch
and ``drop_last`` drops a short last global batch (each must agree with ``data.batch_size`` /
``data.drop_last`` when those are set, and is adopted when they are unset); the order: a plain
``shuffle=True`` is the trainer's seeded permutation, ``shuffle=False`` dataset order, any other
generator-free ``sampler`` (``WeightedRandomSampler``, ``SubsetRandomSampler``, your own) gives the
epoch's index stream, drawn per epoch under the trainer's seed (``set_epoch(epoch)`` first, if it
has one) and cut into global batches like the trainer's own order; ``collate_fn``; and the worker
settings ``num_workers``, ``pin_memory`` (agreeing with ``data.*`` like the batch size),
``persistent_workers``, ``worker_init_fn``, ``prefetch_factor``, ``timeout``,
``multiprocessing_context``, ``pin_memory_device``; a custom ``batch_sampler``: its batches are the global
batches (``trainer/data/batch_sampler.py``). Refused with an error: ``batch_size=None`` without a batch sampler,
a ``generator`` (on the loader or its sampler), a ``DistributedSampler`` and ``in_order=False``.

``val_dataloader()`` gives the same, except that it keeps its own ``batch_size`` and worker settings
(``data.*`` do not apply), a shuffling or custom sampler is honoured as the set to validate on (its
stream for the current epoch, each position once over the ranks), and ``drop_last=True`` leaves out
the short last batch of that stream (``kept_samples``: what one process with that loader leaves out,
the same samples on any world size; validation covers every other sample once).

Every data hook runs under the same seed on every rank (derived from ``trainer.seed``; the training
and validation hooks under one: ``data_hook_seed``), so data drawn from the global generators or an
unseeded ``random_split`` is the same on every rank, and the same in both hooks; the rank's own
random streams continue after.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.api.batch_settings import BatchSettings, resolve_batch
from trainer.data.batch_plan import GlobalBatchPlan, SamplerStream, validation_shard
from trainer.data.batch_sampler import BatchSamplerStream
from trainer.data.loader_reading import (UserLoader, _collate, check_map_style, data_hook_seed, in_dataset_order,
                                         kept_samples, read_loader)
from trainer.data.loaders import InProcessLoader, LoaderOptions, build_loader
from trainer.data.ready_batches import ReadyBatches, loaders_in_dataset_order, several_train_loaders
from trainer.runtime.seeding import derive_seed, seeded
from trainer.data.validation_shard import ValidationShard
from trainer.data.val_data import read_val
from trainer.runtime.rank_logging import rank_zero_user_warning, rank_zero_warn

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 32
_LOADER_DEFAULTS = {"batch_size": 1, "drop_last": False, "num_workers": 0, "pin_memory": False}


def _agree(name: str, given: Any, from_loader: Any, where: str, default: Any) -> Any:
    """``data.<name>`` as given (None: unset) against the train loader's value."""
    if from_loader is None:
        return default if given is None else given
    if given is None or given == from_loader:
        return from_loader
    note = " (DataLoader's default when it is not given)" if from_loader == _LOADER_DEFAULTS[name] else ""
    raise ValueError(
        f"data.{name}={given!r} but {where} returns a DataLoader with {name}={from_loader!r}{note}: make them "
        f"agree: give the DataLoader {name}={given!r}, or leave data.{name} unset (null) to use the loader's"
    )


def _skips_validation(module: TrainModule, trainer: Trainer, hooks: Any) -> bool:
    """As Lightning: a module without ``validation_step`` (or with ``module.validation_step = None``) is not
    validated during ``fit``, whatever validation data it has (one warning where it has some; its
    validation data hooks are not called).
    ``Trainer.validate`` on it is refused before any worker starts (trainer/entry_points.py). A
    pipeline strategy validates with its own loss."""
    from trainer.api.datamodule import GivenLoader
    from trainer.api.module import TrainModule

    turned_off = getattr(module, "validation_step", None) is None  # Lightning's `module.validation_step = None`
    overridden = type(module).validation_step is not TrainModule.validation_step
    if not turned_off and (trainer.strategy.owns_step or overridden):
        return False
    source = hooks.source["val"]
    if isinstance(source, GivenLoader):
        what = hooks.where["val"]
    elif source is not module or any(getattr(type(module), name, None) is not getattr(TrainModule, name)
                                     for name in ("val_dataset", "val_dataloader")):
        what = f"{type(source).__name__}.val_dataset() / val_dataloader()"
    else:
        return True  # no validation data either: nothing to say
    rank_zero_warn(log, "%s has validation data (%s) but does not override validation_step(): validation is skipped, "
                   "as in Lightning; override validation_step() to validate", type(module).__name__, what)
    return True


def overfit_loaders(loaders: Any, where: str, overfit_batches: Any) -> Any:
    """Several training loaders under ``overfit_batches``: read in dataset order (a warning where one
    shuffled or sampled; as Lightning, ``trainer.train_dataloader`` then shows the rebuilt loaders)."""
    rebuilt = loaders_in_dataset_order(loaders)
    if rebuilt is None:
        return loaders
    rank_zero_warn(log, "trainer.overfit_batches=%s: the training loaders of %s are read in dataset order (their "
                   "shuffling or sampler is turned off)", overfit_batches, where)
    return rebuilt


class RunData:
    """The data of one run on one rank, read from the module's hooks once (before the model is wrapped:
    the strategies may need the resolved batch). ``batch``: the resolved ``batch_size``, ``drop_last``,
    ``num_workers``, ``pin_memory``, accumulation and global batch (the Trainer is not written)."""

    def __init__(self, module: TrainModule, trainer: Trainer, sanity_read: Callable[[], Any] | None = None,
                 defer_val: bool = False):
        from trainer.api.datamodule import DataHooks

        self.module, self.trainer = module, trainer
        # The datamodule's hooks where it defines a stage's data; validate / test / predict call only their
        # own stage's hooks (as Lightning), so a datamodule set up for "validate" need not build training data.
        self.hooks = hooks = DataHooks(module, getattr(trainer, "datamodule", None), getattr(trainer, "given_loaders", None))
        stage = getattr(trainer, "stage", None) or "fit"
        self.evaluating = stage in ("test", "predict")  # no validation data either
        seed = trainer.seed
        self._skip_val = self.evaluating or _skips_validation(module, trainer, hooks)
        #: what each stage's data hook last returned ("train", "val", "test", "predict": Lightning's
        #: trainer.train_dataloader / val_dataloaders / ...)
        self.returned: dict[str, Any] = {}
        #: several validation loaders: one part per loader (``dataloader_idx``), else None
        self.val_parts: list[RunData] | None = None
        early_val = None
        #: ``defer_val``: ``val_dataloader()`` is first read at the fit's first validation
        #: (`read_pending_val`; Lightning's moment where no sanity pass reads it first)
        self.val_pending = defer_val and sanity_read is None and not self._skip_val
        self.read_for_sanity = sanity_read is not None and not self._skip_val  # (trainer/loop/data_reload.py)
        if sanity_read is not None and not self._skip_val:  # a sanity pass follows: its loader first (Lightning's order)
            with sanity_read():
                early_val = self.val_hook()
        with seeded(data_hook_seed(seed)):
            loader = self.returned["train"] = hooks.train_dataloader() if stage == "fit" else None
        where = hooks.where["train"]
        if getattr(trainer, "overfit_batches", None) and several_train_loaders(loader):
            loader = self.returned["train"] = overfit_loaders(loader, where, trainer.overfit_batches)
        self.train = read_loader(loader, where, stream_ok=True, batch_sampler_ok=True, limit=(
            "limit_train_batches", getattr(trainer, "limit_train_batches", None))) if loader is not None else None
        given = trainer.batch_arguments  # as the user gave them, None = unset
        train = self.train
        self._train_in_order()  # (overfit_batches)
        data_parallel_size = trainer.strategy.data_parallel_size(trainer.world_size)
        self._batch_stream: BatchSamplerStream | None = None
        if train is not None and train.batch_sampler is not None:  # its batches set the global batch
            self._batch_stream = BatchSamplerStream(train.batch_sampler, len(train.dataset), seed, "train", where)
            if given.global_batch_size not in (None, self._batch_stream.batch_length):
                raise ValueError(f"data.global_batch_size={given.global_batch_size} but {where}'s batch_sampler gives "
                                 f"batches of {self._batch_stream.batch_length}, the global batches; leave it unset")
            train.batch_size = self._batch_stream.micro_batch(data_parallel_size, given.accumulate_grad_batches)
        num_workers = _agree("num_workers", given.num_workers, train and train.options.num_workers, where, 0)
        pin_memory = _agree("pin_memory", given.pin_memory, train and train.options.pin_memory, where, False)
        #: the run's resolved batch settings (the Trainer keeps the ones it was given)
        self.batch = resolve_batch(
            given,
            _agree("batch_size", given.batch_size, train and train.batch_size, where, DEFAULT_BATCH_SIZE),
            _agree("drop_last", given.drop_last, train and train.drop_last, where, False),
            # (ready batches: a global batch is accumulate_grad_batches of them, cut by rows on any world size)
            1 if train is not None and isinstance(train.dataset, ReadyBatches) else data_parallel_size,
            trainer.world_size, num_workers, pin_memory,
        )
        base = train.options if train is not None else LoaderOptions()
        self.train_options = dataclasses.replace(base, num_workers=num_workers, pin_memory=pin_memory,
                                                 prefetch_factor=base.prefetch_factor if num_workers > 0 else None)
        self.train_collate = _collate(module, train.collate_fn, where) if train is not None else module.collate_fn
        if self.val_pending:
            self.val, self.val_set, self.val_parts = None, None, None
        else:
            self.read_val(early_val if sanity_read is not None else self.val_hook())
        self._train_set: Any = train.dataset if train is not None else None
        self._loaders: dict[str, DataLoader | InProcessLoader] = {}
        self.stream_plan: Any = None  # the training stream's plan, when the dataset is an IterableDataset

    def val_hook(self, epoch: int | None = None) -> Any:
        """What ``val_dataloader()`` returns (None without one), under the seed every rank shares
        (``epoch``: a reload's, with its own seed)."""
        if self._skip_val:
            return None
        with seeded(data_hook_seed(self.trainer.seed, epoch)):
            self.returned["val"] = loader = self.hooks.val_dataloader()
        return loader

    def read_val(self, val_loader: Any, epoch: int | None = None) -> None:
        """The validation data from ``val_loader`` (a ``val_hook()`` result; None: ``val_dataset()``; a
        list, tuple or dict of DataLoaders: several, ``val_parts``), see ``trainer/data/val_data.py``."""
        self.val_pending = False
        read_val(self, val_loader, epoch)

    def read_pending_val(self) -> None:
        """The deferred first read of the validation data (``val_pending``), under the seed the build's
        read would have had: the same data as an early read."""
        self.read_val(self.val_hook())

    def set_train(self, train: UserLoader | None, dataset: Any) -> None:
        """The training data read again (``trainer/data/reload.py``): the next plan and loader use it."""
        self.train, self._train_set = train, dataset
        self._train_in_order()
        if dataset is not None:
            check_map_style(dataset, "train_dataset()", stream_ok=True)
        self.forget_loader("train")

    def forget_loader(self, purpose: str) -> None:
        """Build ``purpose``'s next loader afresh (its data changed)."""
        self._loaders.pop(purpose, None)

    def train_set(self) -> Any:
        """The training dataset (``train_dataset()`` is called here, under the data seed, if no loader gave one)."""
        if self._train_set is None:
            with seeded(data_hook_seed(self.trainer.seed)):
                self._train_set = self.hooks.train_dataset()
            check_map_style(self._train_set, "train_dataset()", stream_ok=True)
        return self._train_set

    def plan(self, data_parallel_size: int, batch: BatchSettings | None = None) -> GlobalBatchPlan:
        """The training set's global-batch plan for ``batch`` (default: the resolved ``self.batch``)."""
        trainer, train = self.trainer, self.train
        batch = batch or self.batch
        dataset = self.train_set()
        if isinstance(dataset, IterableDataset):  # a stream: its own plan (trainer/data/streaming/plan.py)
            from trainer.data.streaming.plan import StreamPlan
            from trainer.data.streaming.ready_plan import ReadyBatchPlan

            kind = ReadyBatchPlan if isinstance(dataset, ReadyBatches) else StreamPlan
            self.stream_plan = kind(dataset, trainer, batch, data_parallel_size, trainer.strategy.data_parallel_rank,
                                    self.train_collate, self.train_options)
            return self.stream_plan  # type: ignore[return-value]
        stream = self._batch_stream
        if train is not None and train.sampler is not None and not self._overfit_order():
            stream = SamplerStream(train.sampler, len(dataset), trainer.seed, "train", self.hooks.where["train"])
        return GlobalBatchPlan(
            len(stream) if stream is not None else len(dataset), batch.batch_size, batch.accumulate_grad_batches,
            data_parallel_size, trainer.seed, shuffle=self._train_shuffle(), drop_last=batch.drop_last,
            order=stream,
        )

    def _overfit_order(self) -> bool:
        """``overfit_batches``: the training data in dataset order (`_train_in_order`)."""
        return bool(getattr(self.trainer, "overfit_batches", None))

    def _train_in_order(self) -> None:
        """Under ``overfit_batches`` a training loader's shuffling or sampler is turned off, with
        Lightning's warning; ``trainer.train_dataloader`` then shows it in dataset order, as read."""
        train, trainer = self.train, self.trainer
        if not self._overfit_order():
            return
        if train is None:  # train_dataset(): the trainer's own shuffling is off
            if (getattr(trainer, "stage", None) or "fit") == "fit":
                rank_zero_warn(log, "trainer.overfit_batches=%s: the training data is read in dataset order (the "
                               "trainer's shuffling is turned off)", trainer.overfit_batches)
            return
        if not (train.shuffle or train.sampler is not None):
            return
        order = "shuffle=True" if train.shuffle else f"sampler={type(train.sampler).__name__}"
        rank_zero_user_warning(log, getattr(trainer, "lightning_warnings", False), (
            f"trainer.overfit_batches={trainer.overfit_batches}: you requested to overfit but enabled train dataloader "
            f"shuffling ({self.hooks.where['train']} gives {order}); the training data is read in dataset order"))
        self.returned["train"] = in_dataset_order(self.returned.get("train"))

    def _train_shuffle(self) -> bool:
        """The trainer's seeded permutation: a loader's ``shuffle=True`` or no loader (off when overfitting)."""
        return (self.train is None or self.train.shuffle) and not self._overfit_order()

    def val_shard(self, epoch: int, rank: int, world_size: int, limit: int | None = None) -> ValidationShard:
        """Rank ``rank``'s validation batches (sample indices): every sample, or every position of a
        validation sampler's stream, exactly once over the ranks; with ``limit``, only the first
        ``limit`` of them (``limit_val_batches``: the same samples on any world size)."""
        assert self.val_set is not None
        if isinstance(self.val_set, IterableDataset):  # a stream: read now (trainer/data/streaming/validation.py)
            from trainer.data.streaming.validation import StreamValShard

            return StreamValShard(self, epoch, rank, world_size, limit)  # type: ignore[return-value]
        size = len(self.val_set)
        if self.val is not None and self.val.drop_last:  # the first `kept` positions of the order
            kept = kept_samples(size, self.val_batch_size, True, "val_dataloader()")
            limit = min(limit, kept) if limit is not None else kept
        if self.val is None or (self._val_stream is None and not self.val.shuffle):
            return validation_shard(min(size, limit or size), self.val_batch_size, rank, world_size)
        if self._val_stream is not None:
            order = self._val_stream.epoch_order(epoch)
        else:
            generator = torch.Generator().manual_seed(derive_seed(self.trainer.seed, "val", "epoch", epoch))
            order = torch.randperm(size, generator=generator).tolist()
        order = order[:limit] if limit is not None else order
        return ValidationShard(len(order), self.val_batch_size, rank, world_size, order=order)  # batches built lazily

    def loader(self, dataset: Any, batches: Iterable, purpose: str, seed: int,
               first_batch: int = 0) -> DataLoader | InProcessLoader:
        train = purpose == "train"
        if getattr(batches, "is_stream", False):
            return batches  # a stream's micro-batches, already collated (trainer/data/streaming/)
        loader = build_loader(
            dataset, batches, self.train_collate if train else self.val_collate,
            self.train_options if train else self.val_options, seed, first_batch, reuse=self._loaders.get(purpose),
        )
        self._loaders[purpose] = loader
        return loader
