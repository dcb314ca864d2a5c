"""Resuming a run: which checkpoint (``trainer.resume``, or the latest after a torchrun restart),
loading it into the run, and putting the loop back at the saved step and epoch position."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from trainer import distributed, elastic
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.integrity import resolve as resolve_checkpoint
from trainer.checkpoint.manager import CheckpointError, CheckpointManager
from trainer.data import GlobalBatchPlan

if TYPE_CHECKING:
    from trainer.loop import _Run

log = logging.getLogger("trainer.loop")


def restore_run(run: _Run, plan: GlobalBatchPlan) -> None:
    """Load ``run.trainer.resume`` (if any) into ``run``: a collective."""
    trainer = run.trainer
    # A torchrun elastic restart continues from the latest checkpoint unless told otherwise.
    resume = trainer.resume if trainer.resume is not None else ("auto" if elastic.restart_count() else None)
    if resume is None:
        return
    root = run.checkpoints.root if run.checkpoints is not None else os.path.join(run.run_dir, "checkpoints")
    # Rank 0 decides which checkpoint, so every rank loads the same one.
    path = distributed.broadcast_object(_resolve_or_error(resume, root) if run.rank == 0 else None)
    if isinstance(path, CheckpointError):  # a damaged checkpoint: every rank stops with rank 0's error
        raise CheckpointError(str(path))
    if path is None:
        log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", root)
        return
    manager = run.checkpoints or CheckpointManager(
        CheckpointConfig(save_last=False, save_on_signal=False), run.run_dir, run.strategy
    )
    progress = manager.load(path, run)
    if progress["global_batch_size"] != trainer.global_batch_size:
        log.warning(
            "the checkpoint was trained with global batch %d, this run uses %d: the sample order from here "
            "differs from the original run's (set data.global_batch_size=%d to continue it exactly)",
            progress["global_batch_size"], trainer.global_batch_size, progress["global_batch_size"],
        )
    run.step, run.epoch, run.epoch_step = progress["step"], progress["epoch"], progress["epoch_step"]
    if run.epoch_step > plan.steps_per_epoch:
        raise ValueError(f"{path}: epoch position {run.epoch_step} beyond {plan.steps_per_epoch} steps per epoch")
    log.info("resumed from %s: step %d, epoch %d (+%d steps)", path, run.step, run.epoch, run.epoch_step)


def _resolve_or_error(resume: str, root: str) -> str | CheckpointError | None:
    """Rank 0: the checkpoint to load, or the error to raise on every rank."""
    try:
        return resolve_checkpoint(resume, root)
    except CheckpointError as error:
        return error
