"""The stateful parts of a run that a checkpoint saves and restores, handed over by name (the loop
builds one; the checkpoint layer never sees the loop's run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class RunStates:
    """What ``CheckpointManager.save`` / ``load`` read and restore.

    model / optimizer: the module as the strategy wrapped it, and its optimizer (a list under
    manual optimization with several). progress: a function giving where training stands
    (``step``, ``epoch``, ``epoch_step``, ``global_step``, ``seed`` ... saved as trainer_state.json).
    metrics: the last logged value of each metric (the ``monitor`` ranks checkpoints by it).
    scheduler / precision / callbacks: objects with ``state_dict`` / ``load_state_dict`` (or None).
    data: a stream plan with ``checkpoint_state(epoch, epoch_step)`` (a streaming dataset's position),
    or None for map-style data, whose position is the progress itself.
    hparams_objects: rank 0: a function giving ``{part: {key: pickled value}}``, the objects among the
    hyperparameters (saved as hparams.pt, read by ``load_from_checkpoint`` only), or None.
    """

    model: torch.nn.Module
    optimizer: Any
    progress: Callable[[], dict[str, Any]]
    metrics: dict[str, float] = field(default_factory=dict)
    scheduler: Any = None
    precision: Any = None
    callbacks: Any = None
    data: Any = None
    seed: int = 0
    hparams_objects: Callable[[], dict[str, dict[str, bytes]]] | None = None
