"""The autotuner: which strategy, micro-batch and activation checkpointing is fastest here.

``python -m trainer.autotune recipe=mlp trainer.devices=2 autotune.budget_s=300`` runs every
candidate as its own ``python train.py`` process for a few steps, prints a table (samples/s, peak
memory, ratio to the best) and writes the best as a config file that ``python train.py
--config-path DIR --config-name best`` runs as is. Settings: the ``autotune:`` block of conf/autotune.yaml.

One job a file: ``settings.py`` (overrides, composing, the autotune block), ``candidates.py`` (the
global batch every candidate keeps, the candidates), ``trial.py`` (running and measuring one),
``budget.py`` (when to stop), ``table.py``, ``best_config.py`` (the config file), ``runner.py`` (the
search), ``__main__.py`` (the command).
"""

from trainer.autotune.runner import Outcome, autotune
from trainer.autotune.settings import AutotuneError

__all__ = ["AutotuneError", "Outcome", "autotune"]
