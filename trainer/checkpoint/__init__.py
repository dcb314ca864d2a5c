"""Checkpoints: full and sharded formats, atomic commits, exact resume (see ``layout.py``).

``python -m trainer.checkpoint consolidate PATH OUT`` turns a checkpoint into one file of full weights.
"""

from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.consolidate import consolidate
from trainer.checkpoint.manager import CheckpointError, CheckpointManager, load_file, load_weights

__all__ = ["CheckpointConfig", "CheckpointError", "CheckpointManager", "consolidate", "load_file", "load_weights"]
