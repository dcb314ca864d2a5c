"""torchmetrics objects as ``self.log`` takes them (Lightning's meaning): the value of one batch is
what the metric's forward returned for it; the value of an epoch is ``compute()`` (which syncs the
metric's states over the ranks itself, so nothing reduces it again), after which the metric is reset.

torchmetrics is imported by the user's code, never here: a value can only be a metric object once
the user has imported torchmetrics, so a run that does not use it pays nothing.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def _torchmetrics() -> Any:
    return sys.modules.get("torchmetrics")


def is_metric(value: Any) -> bool:
    """Whether ``value`` is a torchmetrics ``Metric`` (a ``MetricCollection`` is not one)."""
    tm = _torchmetrics()
    return tm is not None and isinstance(value, tm.Metric)


def is_metric_collection(value: Any) -> bool:
    tm = _torchmetrics()
    return tm is not None and isinstance(value, tm.MetricCollection)


def collection_items(collection: Any) -> list[tuple[str, Any]]:
    """``(logged name, metric)`` of each metric of a ``MetricCollection`` (its prefix / postfix applied)."""
    return list(collection.items(keep_base=False, copy_state=False))


def forward_value(name: str, metric: Any) -> torch.Tensor | None:
    """The value the metric's last forward returned (this batch's), or None if it was not called."""
    return metric._forward_cache


def compute_value(name: str, metric: Any) -> torch.Tensor:
    """``metric.compute()`` as a float64 device tensor of one element (synced over the ranks by the metric)."""
    value = metric.compute()
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    if value.numel() != 1:
        raise ValueError(f"self.log({name!r}, <{type(metric).__name__}>): its compute() returned a tensor of shape "
                         f"{tuple(value.shape)}; log a metric whose value is one number (or log its elements "
                         "yourself under their own names)")
    return value.detach().reshape(()).to(torch.float64)


def module_metrics(module: torch.nn.Module) -> list[Any]:
    """The metric objects among ``module``'s submodules (empty without torchmetrics)."""
    tm = _torchmetrics()
    if tm is None:
        return []
    return [m for m in module.modules() if isinstance(m, tm.Metric)]


class MetricStates:
    """The states of some metric objects, saved to be put back: a batch that counts for nothing
    (padding that keeps ranks in lockstep) must not change a metric its step updates."""

    def __init__(self, metrics: list[Any]):
        self._saved = []
        for metric in metrics:
            states = {}
            for attr in metric._defaults:
                value = getattr(metric, attr)
                states[attr] = value.clone() if isinstance(value, torch.Tensor) else list(value)
            extra = {key: getattr(metric, key) for key in ("_update_count", "_forward_cache", "_computed")}
            self._saved.append((metric, states, extra))

    def restore(self) -> None:
        for metric, states, extra in self._saved:
            for attr, value in states.items():
                setattr(metric, attr, value)
            for key, value in extra.items():
                setattr(metric, key, value)
