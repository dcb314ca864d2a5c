"""Lightning's type names (``lightning.pytorch.utilities.types``), for the annotations of ported code."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, TypedDict, Union

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

_NUMBER = Union[int, float]
_METRIC = Union[Tensor, _NUMBER, Any]  # a torchmetrics Metric too
STEP_OUTPUT = Optional[Union[Tensor, Mapping[str, Any]]]
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
_EVALUATE_OUTPUT = Any
_PREDICT_OUTPUT = Any

LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]
LRSchedulerPLType = Union[LRScheduler, ReduceLROnPlateau]


class LRSchedulerConfigType(TypedDict, total=False):
    """The scheduler dict of ``configure_optimizers``."""

    scheduler: Any
    name: Optional[str]
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: Optional[str]
    strict: bool


class OptimizerLRSchedulerConfig(TypedDict, total=False):
    """``configure_optimizers``' dict form."""

    optimizer: Optimizer
    lr_scheduler: Union[LRSchedulerTypeUnion, LRSchedulerConfigType]
    monitor: str


OptimizerLRScheduler = Optional[Union[
    Optimizer,
    Sequence[Optimizer],
    tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfigType]]],
    OptimizerLRSchedulerConfig,
    Sequence[OptimizerLRSchedulerConfig],
]]
