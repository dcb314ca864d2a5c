"""A run's whole state gathered in memory for one checkpoint file (``trainer.save_checkpoint``).

The parts are those of a committed full-format checkpoint folder (``layout.py``): the model and
optimizer state (consolidated on rank 0), ``trainer_state.json`` (the progress), ``extras.pt``
(schedulers, precision, callbacks), every rank's ``rng/rank-NNNNN.pt`` and ``stream/rank-NNNNN.pt``
and the hyperparameter objects. Nothing is written here: the other ranks send their small parts to
rank 0 in one gather, and rank 0 writes the file with a single ``torch.save`` (``single_file.py``),
as Lightning's checkpoint is one ``torch.save`` on rank 0 and none elsewhere.

The marker and ``extras.pt`` are built here for the folder save too (``manager.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from trainer.api.hparams_archive import FILENAME as HPARAMS_FILE
from trainer.checkpoint.run_states import RunStates
from trainer.checkpoint.state import get_rng_state, get_training_state, mesh_layout
from trainer.checkpoint.stream_position import stream_state
from trainer.runtime import distributed

#: the version of the checkpoint layout a marker records
FORMAT_VERSION = 1


def new_marker(step: int, fmt: str, states: RunStates, monitor: str | None = None) -> dict[str, Any]:
    """The commit marker's facts of a checkpoint of ``states`` at ``step`` (``files`` is added at commit)."""
    return {
        "step": step, "format": fmt, "world_size": distributed.world_size(), "mesh": mesh_layout(states.model),
        "version": FORMAT_VERSION, "time": time.time(),
        "metrics": {k: v for k, v in states.metrics.items() if k == monitor},
    }


def extras_of(states: RunStates, callbacks: dict[str, Any] | None = None) -> dict[str, Any]:
    """``extras.pt``: the schedulers with their event counters, the loss scaler and the callbacks'
    states (``callbacks``: already taken; else taken here)."""
    if callbacks is None:
        callbacks = states.callbacks.state_dict() if states.callbacks is not None else {}
    return {
        "scheduler": states.scheduler.state_dict() if states.scheduler is not None else None,
        "precision": states.precision.state_dict() if states.precision is not None else {},
        "callbacks": callbacks,
    }


class _Shipped(NamedTuple):
    """A tensor on its way to rank 0 as plain values: pickling a tensor itself goes through
    ``torch.save``, which the other ranks never call for a checkpoint."""

    dtype: str
    values: Any


def _map(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """``tree`` (dicts, lists, tuples) with ``leaf`` applied to everything else in it."""
    if isinstance(tree, dict):
        return {key: _map(value, leaf) for key, value in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_map(value, leaf) for value in tree)
    return leaf(tree)


def _on_cpu(value: Any) -> Any:
    """The full state's tensors on the CPU (one process keeps them on the device; several are gathered
    to rank 0's CPU already): a file that loads anywhere."""
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _ship(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _Shipped(str(value.dtype).removeprefix("torch."), value.detach().cpu().tolist())
    return value


def _land(value: Any) -> Any:
    if isinstance(value, _Shipped):
        return torch.tensor(value.values, dtype=getattr(torch, value.dtype))
    return value


@dataclass
class FileState:
    """Rank 0's view of a checkpoint to write as one file: ``objects`` maps a file of the folder
    (``extras.pt``, ``rng/rank-00001.pt`` ...) to its content."""

    marker: dict[str, Any]
    training: dict[str, Any]  # {"model": ..., "optim": ...}, full
    progress: dict[str, Any]
    extras: dict[str, Any]
    objects: dict[str, Any]


def gather_file_state(states: RunStates, strategy: Any) -> FileState | None:
    """Every rank, at the same point (a collective): the run's state for one file, on rank 0 (None
    on the others). The callbacks' ``state_dict`` and ``on_save_checkpoint`` hooks run on every rank
    (as Lightning's do); rank 0's are kept."""
    progress = states.progress()
    training = _map(get_training_state(states.model, states.optimizer, True, strategy), _on_cpu)
    callbacks = states.callbacks.state_dict() if states.callbacks is not None else {}
    rank = distributed.rank()
    mine = {f"rng/rank-{rank:05d}.pt": get_rng_state(),
            **stream_state(states.data, progress["epoch"], progress["epoch_step"])}
    gathered = distributed.gather_object(_map(mine, _ship))
    if gathered is None:
        return None
    objects = {name: _map(part, _land) for parts in gathered for name, part in parts.items()}
    hparams_objects = states.hparams_objects() if states.hparams_objects is not None else None
    if hparams_objects:
        objects[HPARAMS_FILE] = hparams_objects
    return FileState(marker=new_marker(progress["step"], "full", states), training=training, progress=progress,
                     extras=extras_of(states, callbacks), objects=objects)
