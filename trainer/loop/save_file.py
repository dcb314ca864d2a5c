"""``trainer.save_checkpoint(path)``: the run's whole state as one checkpoint file (Lightning's ``.ckpt``
shape, `trainer.checkpoint.single_file`), a collective called on every rank at the same point.

The state is saved as a full-format checkpoint folder beside ``path`` (``.saving-<name>/``, the
usual atomic save), packed by rank 0 into ``path`` (written under a temporary name, then renamed)
and the folder removed; every rank returns once the file is there.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from trainer.api.hparams_display import checkpoint_record
from trainer.checkpoint import layout
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.single_file import pack
from trainer.runtime import distributed


def save_checkpoint_file(run: Any, path: Any, weights_only: bool = False) -> str:
    """Save ``run`` (a rank's run) into the file ``path``; returns its absolute path."""
    if "full" not in run.strategy.checkpoint_formats:
        raise ValueError(f"save_checkpoint({os.fspath(path)!r}): {type(run.strategy).__name__} saves sharded "
                         "checkpoints only (folders); use checkpoint=... or a ModelCheckpoint, which keep the folder layout")
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    root = os.path.join(os.path.dirname(path), f".saving-{os.path.basename(path)}")
    config = CheckpointConfig(dir=root, format="full", keep_last=None, save_last=False, save_on_signal=False)
    manager = CheckpointManager(config, run.run_dir, run.strategy)
    manager.setup()
    try:
        run.settle_nonfinite()  # a NaN state is never saved
        manager.save(run.checkpoint_states())
        manager.finish()
        if run.rank == 0:
            pack(layout.find_latest(root), path, weights_only, _hparams(run.module), _optimizer_states(run))
    finally:
        manager.close(clean=False)
        if run.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    distributed.barrier()
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
