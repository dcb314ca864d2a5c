"""Metrics: weighted sums kept on the device, reduced across ranks only when they are logged.

Every value a step returns is a mean over its (micro-)batch. The trainer adds ``value * weight``
(weight = samples or tokens that count) into device tensors; reducing the sums and the total
weight across ranks then gives the exact mean over the global batch or the whole validation
set, with no host sync and no collective on steps that are not logged.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from trainer.runtime import distributed


def split_step_output(output: Any, where: str) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """``(loss, other metrics)`` from what a step returned: a tensor, a dict with "loss", or None."""
    if output is None:
        return None, {}
    if isinstance(output, torch.Tensor):
        return output, {}
    if isinstance(output, Mapping):
        metrics = {str(k): v for k, v in output.items() if k != "loss"}
        return output.get("loss"), metrics
    raise TypeError(f"{where} returned {type(output).__name__}; return a loss tensor or a dict with 'loss'")


class WeightedSums:
    """Running ``sum(value * weight)`` per metric and ``sum(weight)``, on one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.weight = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, values: Mapping[str, Any], weight: float | torch.Tensor) -> None:
        weight_tensor = torch.as_tensor(weight, dtype=torch.float64, device=self.device)
        for name, value in values.items():
            value = torch.as_tensor(value, device=self.device).detach().to(torch.float64)
            if value.numel() != 1:
                raise ValueError(f"metric {name!r} has shape {tuple(value.shape)}; metrics must be scalars")
            contribution = value.reshape(()) * weight_tensor
            if name in self.sums:
                self.sums[name] += contribution
            else:
                self.sums[name] = contribution
        self.weight += weight_tensor

    def reduce(self, prefix: str, strategy: Any, some_ranks_may_be_empty: bool = False) -> dict[str, float]:
        """Exact means over every rank's contributions (one all-reduce), as Python floats.

        ``some_ranks_may_be_empty``: a rank that saw no data (a validation set smaller than the
        world) contributes zeros; the names are then agreed with an object gather, not a checksum.
        """
        names = sorted(self.sums)
        if some_ranks_may_be_empty:
            per_rank = distributed.all_gather_object(names)
            union = sorted(set().union(*per_rank))
            bad = [r for r, n in enumerate(per_rank) if n and n != union]
            if bad:
                lines = "; ".join(f"rank {r}: {n}" for r, n in enumerate(per_rank))
                raise distributed.MetricKeyMismatch(
                    f"ranks logged different {prefix.rstrip('/')} metric keys ({lines}); every rank must return the same keys"
                )
            zero = torch.zeros((), dtype=torch.float64, device=self.device)
            names, sums = union, {n: self.sums.get(n, zero) for n in union}
        else:
            distributed.check_same_keys(names, prefix.rstrip("/"))
            sums = self.sums
        if not names:
            return {}
        packed = torch.stack([sums[n] for n in names] + [self.weight])
        strategy.all_reduce_sum(packed)
        total = packed[-1].clamp_min(1e-300)
        means = (packed[:-1] / total).tolist()
        return {f"{prefix}{name}": value for name, value in zip(names, means)}


def format_metrics(metrics: dict[str, float]) -> str:
    """``name=value`` pairs for a log line (4 significant digits)."""
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
