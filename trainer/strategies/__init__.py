"""Strategies: how a run uses its processes and devices. The registry is the Hydra config group
``conf/strategy/`` (``registry.py``): a yaml's ``_target_`` names the class, for the command line
and ``Trainer(strategy="<name>")`` alike, so modules here need not be strategies.

- ``base.py``: the interface the loop and the checkpoints call (``Strategy``, ``OwnedStep``,
  ``OptimizerStateIO``); ``single.py``, ``ddp.py`` (with ZeRO-1), ``fsdp.py``, ``pipeline.py``: the
  strategies; ``zero1_state.py``: ZeRO-1's optimizer state in checkpoints;
  ``pipeline_*.py``: the pipeline's process groups (``pipeline_groups.py``), cutting layers into
  stages (``pipeline_partition.py``), building the stages (``pipeline_build.py``), micro-batches
  (``pipeline_batches.py``), gradients and norms (``pipeline_gradients.py``), state gathering
  (``pipeline_state.py``), the step through the schedule (``pipeline_schedule_step.py``; the loop's
  micro-batches: ``trainer/loop/pipeline_micro_batches.py``) and strategy=nd's degrees mapped onto
  the pipeline's arguments (``pipeline_degrees.py``).
"""

from __future__ import annotations

from trainer.strategies.base import Strategy
from trainer.strategies.registry import add_config_dir, available_strategies, resolve_strategy, strategy_class

__all__ = ["Strategy", "add_config_dir", "available_strategies", "resolve_strategy", "strategy_class"]
