"""``trainer.save_checkpoint(path)``: the run's whole state as one checkpoint file (Lightning's ``.ckpt``
shape, `trainer.checkpoint.single_file`), a collective called on every rank at the same point.

Every rank gives its part of the state (`trainer.checkpoint.file_state`: one gather, nothing
written); rank 0 writes the file with one ``torch.save`` under a temporary name and renames it over
``path``; the other ranks write nothing. Every rank returns once the file is there, or raises the
same error when rank 0's write failed (the previous file at ``path``, if any, is unchanged).
"""

from __future__ import annotations

import os
from typing import Any

from trainer.api.hparams_display import checkpoint_record
from trainer.checkpoint import save_failure
from trainer.checkpoint.file_state import gather_file_state
from trainer.checkpoint.loading import CheckpointError
from trainer.checkpoint.single_file import packed, write_atomic
from trainer.runtime import distributed


def save_checkpoint_file(run: Any, path: Any, weights_only: bool = False) -> str:
    """Save ``run`` (a rank's run) into the file ``path``; returns its absolute path."""
    if "full" not in run.strategy.checkpoint_formats:
        raise ValueError(f"save_checkpoint({os.fspath(path)!r}): {type(run.strategy).__name__} saves sharded "
                         "checkpoints only (folders); use checkpoint=... or a ModelCheckpoint, which keep the folder layout")
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    run.settle_nonfinite()  # a NaN state is never saved
    state = gather_file_state(run.checkpoint_states(), run.strategy)
    failed = None
    if state is not None:  # rank 0
        try:
            write_atomic(packed(state, weights_only, _hparams(run.module), _optimizer_states(run)), path)
        except Exception as error:  # a full disk, most often: every rank raises the same line
            failed = save_failure.failure(error, 0)
    failed = distributed.broadcast_object(failed)  # (also: every rank returns once the file is there)
    if failed is not None:
        _, cause, _ = failed
        raise CheckpointError(f"checkpoint file {path} not saved ({cause}; "
                              f"{save_failure.space_on(os.path.dirname(path))}); a previous file there is unchanged")
    return path


def _hparams(module: Any) -> dict[str, Any]:
    """The module's hyperparameters that are plain values (Lightning's ``hyper_parameters``)."""
    record = checkpoint_record(getattr(module, "hparams", None) or {})
    hidden = set(record["redacted"]) | set(record["objects"])
    return {key: value for key, value in record["values"].items() if key not in hidden}


def _optimizer_states(run: Any) -> list | None:
    """Lightning's ``optimizer_states`` (each optimizer's own ``state_dict()``) in one process;
    None (the consolidated state this trainer resumes from) on several."""
    if distributed.world_size() > 1:
        return None
    optimizers = run.optimizer if isinstance(run.optimizer, (list, tuple)) else [run.optimizer]
    return [optimizer.state_dict() for optimizer in optimizers if optimizer is not None]
