"""What ``self.log`` keeps per logged name on one rank: its options (`LogOptions`, ``self.log``'s
arguments resolved), its running aggregate (`Aggregate`: ``value * weight`` for a mean, a sum,
a running max / min, or a metric object) and the scopes that hold them (`Scope`: a logging
step's, an epoch's or an evaluation run's); `checked_value` turns a logged value into what is
added (no host sync). Used by ``log_collector.py`` (collection) and ``log_reduction.py`` (reduction)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.runtime.metric_objects import is_metric_collection

REDUCE_FX = ("mean", "sum", "max", "min")


@dataclass(frozen=True)
class LogOptions:
    """How one name is aggregated and where it goes (``self.log``'s arguments, resolved)."""

    on_step: bool
    on_epoch: bool
    reduce_fx: str
    sync_dist: bool
    prog_bar: bool
    logger: bool
    metric: bool = False  # the value is a torchmetrics object: its epoch value is its compute()

    @property
    def agreed(self) -> bool:
        """Whether every rank takes part in this name's reduction (synced values, metric objects)."""
        return self.sync_dist or self.metric


@dataclass
class Aggregate:
    """One name's running aggregate on this rank: ``total`` (sum of value x weight, sum, max or min:
    a Python float or a device tensor) and ``weight`` (a Python float; mean only); or, for the epoch
    value of a metric object, ``metric`` (computed when the epoch's values are reduced)."""

    options: LogOptions
    total: Any = None
    weight: float = 0.0
    metric: Any = None

    def add(self, value: Any, weight: float) -> None:
        fx = self.options.reduce_fx
        if fx == "mean":
            value, self.weight = value * weight, self.weight + weight
        if self.total is None:
            self.total = value
        elif fx in ("mean", "sum"):
            self.total = self.total + value
        else:
            self.total = _extreme(self.total, value, fx)


def _extreme(a: Any, b: Any, fx: str) -> Any:
    """max / min of two floats or tensors; a Python float meets a tensor through ``clamp`` (no copy
    of the float to the device, which would wait for it)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.maximum(a, b) if fx == "max" else torch.minimum(a, b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        tensor, number = (a, b) if isinstance(a, torch.Tensor) else (b, a)
        return tensor.clamp(min=number) if fx == "max" else tensor.clamp(max=number)
    return max(a, b) if fx == "max" else min(a, b)


@dataclass
class Scope:
    """The aggregates of one scope: a logging step's, or one epoch / evaluation run's."""

    values: dict[str, Aggregate] = field(default_factory=dict)


def checked_value(name: str, value: Any) -> Any:
    """A Python float, or a detached float64 tensor of one element (metadata checks only: no sync)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...): the value is a tensor of shape {tuple(value.shape)} (a logged "
                             "tensor must have a single element); log a Python number or a tensor with one element "
                             "(reduce it first, e.g. .mean())")
        if value.is_complex():
            raise ValueError(f"self.log({name!r}, ...): the value is a complex tensor; log a real number")
        return value.detach().reshape(()).to(torch.float64)
    if isinstance(value, numbers.Real):
        return float(value)
    if is_metric_collection(value):
        raise ValueError(f"self.log({name!r}, ...): the value is a MetricCollection; log it with self.log_dict")
    # (a ValueError, as Lightning's for a value it cannot log, starting as Lightning's message does)
    raise ValueError(f"`self.log({name}, {value})` was called with a {type(value).__name__}; log a Python number, a "
                     "one-element tensor or a torchmetrics Metric")
