"""What a run returns to Hydra: with ``objective.metric`` set, one logged metric's last value (the number a
sweeper optimises, the same value the run's metrics.jsonl shows last for it); without, every metric's last value."""

from __future__ import annotations

from typing import Any

_KEYS = ("metric",)


def check_objective(config: dict) -> None:
    """``objective``'s keys and value, before anything is built: an error naming the key."""
    objective = config.get("objective")
    if objective is None:
        return
    if not isinstance(objective, dict):
        raise ValueError(f"objective={objective!r} must be a node with metric: <a logged metric> (or null)")
    extra = [key for key in objective if key not in _KEYS]
    if extra:
        raise ValueError(f"objective.{extra[0]} is not an objective setting; the settings are {', '.join(_KEYS)}")
    metric = objective.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(f"objective.metric={metric!r} must be the name of a logged metric (e.g. val/loss) or null")


def objective_value(config: dict, metrics: Any) -> Any:
    """``metrics`` (what fit returned) or, with ``objective.metric``, that metric's value as a float."""
    metric = (config.get("objective") or {}).get("metric")
    if metric is None:
        return metrics
    if metric not in metrics:
        raise ValueError(f"objective.metric={metric}: the run logged no such metric; it logged "
                         f"{', '.join(sorted(metrics)) or 'none'}")
    return float(metrics[metric])
