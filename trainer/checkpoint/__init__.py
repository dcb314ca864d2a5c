"""Checkpoints: full and sharded formats, atomic commits, exact resume (see ``layout.py``).

``python -m trainer.checkpoint consolidate PATH OUT`` turns a checkpoint into one file of full weights.

- ``config.py`` the options; ``manager.py`` when and what to save, atomic commits, loading;
  ``state.py`` model / optimizer / RNG state in a layout-free form; ``layout.py`` the files;
  ``integrity.py`` checking a checkpoint is whole; ``resume.py`` ``trainer.resume``;
  ``init_from.py`` ``trainer.init_from``; ``consolidate.py`` sharded -> one file.
- Optimizers whose state lives elsewhere (ZeRO-1) plug in through the strategy's
  ``OptimizerStateIO`` (``trainer/strategies/base.py``): this package imports that interface,
  the strategies never import this package.
"""

from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.consolidate import consolidate
from trainer.checkpoint.init_from import load_weights
from trainer.checkpoint.manager import CheckpointError, CheckpointManager, load_file

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointManager", "consolidate", "load_file", "load_weights"]
