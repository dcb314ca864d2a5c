"""Resuming a run: which checkpoint (``ckpt_path=`` of ``fit`` / ``validate``, ``trainer.resume``,
or the latest after a torchrun restart), loading it into the run, and putting the loop back at the
saved step and epoch position.

``resolve_ckpt_path`` is the one place that reads ``ckpt_path`` (``fit``, ``validate``, and the
evaluation entry points that come later reuse it); ``checkpoint_path`` finds the directory on rank 0.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from trainer.runtime import distributed
from trainer.runtime import elastic
from trainer.checkpoint import integrity, layout
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.integrity import resolve as resolve_checkpoint
from trainer.checkpoint.manager import CheckpointError, CheckpointManager, load_file, load_training_state
from trainer.data.batch_plan import GlobalBatchPlan
from trainer.loggers.resume_history import resume_loggers
from trainer.loggers.wandb_run_id import run_dir_of_checkpoint
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.checkpoint.stream_position import restore_stream_state

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)

CKPT_PATH_NAMES = ("last", "best")


def resolve_ckpt_path(ckpt_path: str | None, resume: str | None, checkpoint: CheckpointConfig | None) -> str | None:
    """What a ``fit`` / ``validate`` call loads, checked in the launcher before any worker starts:
    None (nothing), "last" (the latest complete checkpoint; ``trainer.resume=auto`` means the same),
    "best" (the best by ``checkpoint.monitor``) or an absolute path. ``ckpt_path`` (Lightning's name)
    and ``trainer.resume`` may both be given only when they name the same checkpoint."""

    def normal(value: str | None, name: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"{name}={value!r} must be 'last', 'best' or a checkpoint path")
        value = os.fspath(value)
        if value in ("last", "auto"):
            return "last"
        if value == "best":
            if checkpoint is not None and not checkpoint.monitor and getattr(checkpoint, "best_is_latest_without_monitor", False):
                return "last"  # Lightning's ModelCheckpoint without monitor: its best is the newest
            if checkpoint is None or not checkpoint.monitor:
                raise ValueError(f"{name}='best' needs checkpoint.monitor (the metric that ranks checkpoints); "
                                 "give ckpt_path='last' or a checkpoint path instead")
            return "best"
        if not os.path.exists(value):
            raise ValueError(f"{name}={value!r} does not exist; give 'last', 'best' (with checkpoint.monitor), "
                             "a checkpoint directory or a directory of checkpoints")
        return os.path.abspath(value)

    requested, configured = normal(ckpt_path, "ckpt_path"), normal(resume, "trainer.resume")
    if requested is not None and configured is not None and requested != configured:
        raise ValueError(f"ckpt_path={ckpt_path!r} and trainer.resume={resume!r} name different checkpoints; "
                         "give one of them (or the same one in both)")
    return requested if requested is not None else configured


def checkpoint_root(run: RankRun) -> str:
    """The directory the run's checkpoints go to (``checkpoint.dir`` or ``<run_dir>/checkpoints``)."""
    if run.checkpoints is not None:
        return run.checkpoints.root
    config = run.trainer.checkpoint
    return os.path.abspath(config.dir if config is not None and config.dir else os.path.join(run.run_dir, "checkpoints"))


def checkpoint_path(source: str, root: str, checkpoint: CheckpointConfig | None) -> str | None:
    """The checkpoint directory ``source`` (from ``resolve_ckpt_path``) names; None for "last"
    when there is none yet. Call on rank 0 and broadcast, so every rank loads the same one."""
    if source == "last":
        return resolve_checkpoint("auto", root)
    if source == "best":
        assert checkpoint is not None and checkpoint.monitor
        scored = [(layout.read_marker(p).get("metrics", {}).get(checkpoint.monitor), p)
                  for p in layout.committed_checkpoints(root)]
        scored = [(value, p) for value, p in scored if value is not None]
        if not scored:
            raise FileNotFoundError(f"ckpt_path='best': no checkpoint in {root} has a value of "
                                    f"checkpoint.monitor={checkpoint.monitor!r}")
        return (max if checkpoint.mode == "max" else min)(scored, key=lambda item: item[0])[1]
    return resolve_checkpoint(source, root)


def agree_on_checkpoint(run: RankRun, source: str, root: str) -> str | None:
    """``checkpoint_path`` decided by rank 0, so every rank loads the same one; a checkpoint that
    cannot be found fails on every rank (not on rank 0 alone while the others wait). A collective."""
    found = None
    if run.rank == 0:
        try:
            found = ("ok", checkpoint_path(source, root, run.trainer.checkpoint))
        except CheckpointError as error:  # a damaged checkpoint (it names the file)
            found = ("damaged", str(error))
        except OSError as error:  # FileNotFoundError included
            found = ("error", str(error))
    status, path = distributed.broadcast_object(found)
    if status == "damaged":
        raise CheckpointError(path)
    if status == "error":
        raise FileNotFoundError(path)
    return path


def restore_run(run: RankRun, plan: GlobalBatchPlan) -> None:
    """Load the checkpoint of ``run.trainer.ckpt_path`` (if any) into ``run``: a collective."""
    trainer = run.trainer
    # A torchrun elastic restart continues from the latest checkpoint unless told otherwise.
    source = getattr(trainer, "ckpt_path", None)
    if source is None:
        source = resolve_ckpt_path(None, trainer.resume, trainer.checkpoint)
    if source is None and elastic.restart_count():
        source = "last"
    if source is None:
        return
    root = checkpoint_root(run)
    path = agree_on_checkpoint(run, source, root)
    if path is None:
        log.info("trainer.resume=auto: no checkpoint in %s yet, starting from scratch", root)
        return
    manager = run.checkpoints or CheckpointManager(
        CheckpointConfig(save_last=False, save_on_signal=False), run.run_dir, run.strategy
    )
    progress = manager.load(path, run.checkpoint_states())
    if progress["global_batch_size"] != trainer.global_batch_size:
        rank_zero_warn(  # every rank would say it alike
            log, "the checkpoint was trained with global batch %d, this run uses %d: the sample order from here "
            "differs from the original run's (set data.global_batch_size=%d to continue it exactly)",
            progress["global_batch_size"], trainer.global_batch_size, progress["global_batch_size"],
        )
    # Manual optimization: global_step is its own count (a checkpoint from before it was saved: the batches).
    run.resume(progress["step"], progress["epoch"], progress["epoch_step"], progress.get("global_step"))
    if run.rank == 0:  # the dashboards back at the checkpoint: nothing after it twice, nothing before it missing
        where = layout.read_marker(path).get("packed_from", path)  # a checkpoint file: where it lies
        other_run = None if os.path.dirname(os.path.abspath(where)) == os.path.abspath(root) else run_dir_of_checkpoint(where)
        resume_loggers(run.loggers, run.step, progress.get("logged_rows"),
                       other_run if other_run != os.path.abspath(run.run_dir) else None)
    if run.epoch_step > plan.steps_per_epoch:
        raise ValueError(f"{path}: epoch position {run.epoch_step} beyond {plan.steps_per_epoch} steps per epoch")
    restore_stream_state(plan, path, run.epoch, run.epoch_step)  # a streaming dataset's position
    _check_schedule_length(run, progress)
    log.info("resumed from %s: step %d, epoch %d (+%d steps)", path, run.step, run.epoch, run.epoch_step)


def _check_schedule_length(run: RankRun, progress: dict[str, Any]) -> None:
    """One warning (rank 0) when the learning-rate schedule now spans another number of steps than
    in the checkpoint's run (a schedule tied to ``trainer.max_steps``, extended with a larger one)."""
    old, new = progress.get("schedule_steps"), run.lr_scheduling.schedule_steps() if getattr(run, "lr_scheduling", None) is not None else None
    if old is None or new is None or old == new or run.rank != 0:
        return
    log.warning(
        "the learning-rate schedule changed length on resume: %d steps in the checkpoint's run (trainer.max_steps=%s), "
        "%d steps now (trainer.max_steps=%s); from step %d the learning rate follows the %d-step schedule, so this run "
        "is not one uninterrupted %d-step run (give the schedule a fixed length, e.g. scheduler.total_steps=%d, "
        "to extend a run exactly)",
        old, progress.get("max_steps", "?"), new, run.trainer.max_steps, run.step + 1, new, new, old,
    )


def load_for_evaluation(run: RankRun) -> None:
    """``validate`` with a checkpoint (``ckpt_path=`` or ``trainer.resume``): load its model weights
    (not the optimizer) into ``run.module``; the metrics are logged at its step. A collective."""
    source = getattr(run.trainer, "ckpt_path", None)
    if source is None:
        return
    root = checkpoint_root(run)
    path = agree_on_checkpoint(run, source, root)
    if path is None:
        raise FileNotFoundError(f"ckpt_path='last' (or trainer.resume=auto): no complete checkpoint in {root} to validate")
    marker = layout.read_marker(path)
    integrity.verify(path, marker)  # a damaged file is named before anything is read
    load_training_state(path, run.module, None, marker["format"], part_of_model=run.strategy.owns_step)
    # As Lightning restores a checkpoint for evaluation: the module's on_load_checkpoint, the
    # datamodule's and the callbacks' states and hooks (trainer/callbacks/callback_list.py).
    extras_file = os.path.join(path, "extras.pt")
    if os.path.isfile(extras_file):
        run.callbacks.load_state_dict(load_file(extras_file).get("callbacks") or {})
    run.show(marker["step"], _saved_global_step(path))  # (a manual run's global_step differs)
    log.info("evaluating the weights of %s (step %d)", path, run.step)


def _saved_global_step(path: str) -> int | None:
    """The checkpoint's global_step (optimizer steps; None in a checkpoint older than the field)."""
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as handle:
            return json.load(handle).get("global_step")
    except (OSError, ValueError):
        return None
