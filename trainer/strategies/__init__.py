"""Strategy plugins. The Hydra group ``conf/strategy/`` is the registry for configs; for the
Python API a name resolves to the ``STRATEGY`` class of ``trainer/strategies/<name>.py``.

Files: ``base.py`` (``Strategy``, the interface the loop talks to), ``single.py`` (one process, the
reference), ``ddp.py`` (data parallel, optional ZeRO-1), ``fsdp.py`` (FSDP2 sharding),
``pipeline.py`` (pipeline stages, optionally x data parallel); ``trainer/pipeline_partition.py`` cuts
the layers into stages (outside this package, where every module is a strategy).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from trainer.strategies.base import Strategy

__all__ = ["Strategy", "available_strategies", "resolve_strategy"]


def available_strategies() -> list[str]:
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if info.name != "base" and not info.name.startswith("_")
    )


def resolve_strategy(strategy: str | Strategy, **options: Any) -> Strategy:
    """A Strategy instance from a name (``"ddp"``) or an instance (returned as is)."""
    if isinstance(strategy, Strategy):
        return strategy
    names = available_strategies()
    if strategy not in names:
        raise ValueError(f"unknown strategy {strategy!r}; available: {', '.join(names)}")
    module = importlib.import_module(f"{__name__}.{strategy}")
    return module.STRATEGY(**options)
