"""Lightning's ``lightning.pytorch.strategies``, for what a program reads of the strategy it runs under.

``trainer.strategy`` is one of this trainer's strategies (``trainer.strategies``); the names here are
what a Lightning program checks it against: ``Strategy`` (every strategy), ``ParallelStrategy`` (every
strategy that runs on several processes: DDP, FSDP, the pipeline, ``nd``), ``SingleDeviceStrategy``,
``DDPStrategy``, ``FSDPStrategy``. ``trainer.strategy.num_processes`` is the run's processes on this
machine, as Lightning's. A strategy is chosen with ``Trainer(strategy="ddp")`` (a name) or an instance
of ``trainer.strategies``; Lightning's other strategy classes are an ImportError saying what to use.
"""

from __future__ import annotations

from typing import Any

from trainer.lightning._missing import missing_names
from trainer.strategies.base import Strategy
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.single import SingleDeviceStrategy


class _RunsOnSeveralProcesses(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, Strategy) and bool(instance.supports_multiple_devices)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return isinstance(subclass, type) and issubclass(subclass, Strategy) and bool(
            getattr(subclass, "supports_multiple_devices", False))


class ParallelStrategy(metaclass=_RunsOnSeveralProcesses):
    """What ``isinstance(trainer.strategy, ParallelStrategy)`` asks: does the run's strategy run on several
    processes? Not a strategy to build: give ``Trainer(strategy="ddp" / "fsdp" / ...)``."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("ParallelStrategy is what isinstance(trainer.strategy, ParallelStrategy) checks; to run on "
                        "several processes give Trainer(strategy='ddp' / 'fsdp' / 'pipeline' / 'nd')")


_USE_A_NAME = "Trainer(strategy='ddp' / 'fsdp' / 'fsdp_grad_op' / 'pipeline' / 'nd' ...) or a trainer.strategies instance"
_MISSING = {name: _USE_A_NAME for name in (
    "DDPSpawnStrategy", "DeepSpeedStrategy", "ModelParallelStrategy", "XLAStrategy", "SingleDeviceXLAStrategy",
    "StrategyRegistry")}

__all__ = ["DDPStrategy", "FSDPStrategy", "ParallelStrategy", "SingleDeviceStrategy", "Strategy"]

__getattr__ = missing_names(__name__, _MISSING)
