"""Checkpoints: full and sharded formats, atomic commits, exact resume (see ``layout.py``).

``python -m trainer.checkpoint consolidate PATH OUT`` turns a checkpoint into one file of full weights.

Files, one job each:

- ``config.py``: what to checkpoint, when, how many to keep (``CheckpointConfig``, the config group).
- ``manager.py``: ``CheckpointManager``, saving and restoring a run: triggers, signals, async writes,
  rank 0's background commit.
- ``loading.py``: reading a checkpoint into a model: ``load_file``, ``load_training_state``,
  ``load_weights`` (``trainer.init_from``), ``CheckpointError``.
- ``layout.py``: where checkpoints live on disk, the atomic commit, ``latest``, retention.
- ``integrity.py``: the files (and sizes) a committed checkpoint holds, checked before a load.
- ``state.py``: model / optimizer state in a layout-free form, and this rank's RNG states.
- ``resume.py``: which checkpoint a run resumes from, and putting the loop back at its position.
- ``consolidate.py`` / ``__main__.py``: one file of full weights from any checkpoint.

Optimizers whose state lives elsewhere (ZeRO-1) plug in through the strategy's ``OptimizerStateIO``
(``trainer/strategies/base.py``): this package imports that interface, the strategies never import
this package.
"""

from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.consolidate import consolidate
from trainer.checkpoint.manager import CheckpointError, CheckpointManager, load_file, load_weights
from trainer.checkpoint.run_states import RunStates

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointManager", "RunStates", "consolidate", "load_file",
           "load_weights"]
