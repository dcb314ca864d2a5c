"""The StatefulDataLoader (torchdata) that reads one rank's stream for one epoch."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from trainer.data.loaders import _init_worker
from trainer.data.streaming.reader import ShardReader


def _as_is(sample: Any) -> Any:
    return sample  # samples travel uncollated; the plan collates micro-batches in the main process


def stream_loader(plan: Any, epoch: int) -> Any:
    """A loader of single samples from ``plan``'s shards for ``epoch`` (its state: every reader's position)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    options, workers = plan.options, plan.options.num_workers
    reader = ShardReader(plan.dataset, plan.num_shards, plan.mode, plan.rank, plan.world, max(workers, 1),
                         plan.seed, epoch)
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in this torch
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return _build(StatefulDataLoader, reader, options, workers, plan.loader_seed(epoch))


def _build(StatefulDataLoader: Any, reader: Any, options: Any, workers: int, seed: int) -> Any:
    return StatefulDataLoader(
        reader,
        batch_size=None,
        collate_fn=_as_is,
        num_workers=workers,
        worker_init_fn=functools.partial(_init_worker, options.worker_init_fn) if workers else None,
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=options.prefetch_factor if workers else None,
        timeout=options.timeout,
        multiprocessing_context=options.multiprocessing_context if workers else None,
        snapshot_every_n_steps=1,  # every sample carries its worker's position: exact at any step boundary
    )
