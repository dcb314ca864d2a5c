"""The whole JSON -> our config, as a list of settings (dotted config path, value, how to apply it),
plus the unmapped keys sorted into speed-only (one warning) and math-changing (an error)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.deepspeed_config import batch, monitors, optimizer, precision, reading, zero


@dataclass
class Mapped:
    """What a DeepSpeed JSON sets. ``leaves``: path -> value, set one by one. ``nodes``: path -> a
    whole config node (``_target_`` ...) that replaces the composed one. ``strategy``: (name, settings).
    ``loggers``: our logger name -> options, or None for "not selected"."""

    leaves: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    strategy: tuple[str, dict[str, Any]] = ("ddp", {})
    loggers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    speed_only: list[str] = field(default_factory=list)


def map_json(data: dict[str, Any], world_size: int, world_from: str, start_dir: str = ".") -> Mapped:
    """Map ``data`` (a DeepSpeed config) for ``world_size`` processes. Raises ValueError for
    inconsistent values and for keys that change the math and are not reproduced (all named at once).
    Relative monitor paths are taken from ``start_dir`` (the directory the run starts in)."""
    speed, math = reading.sort_top_level(data)
    precision_node, more_speed, more_math = precision.precision_node(data)
    name, strategy_settings, zero_speed, zero_math = zero.strategy_choice(data)
    optimizer_node, optimizer_speed = optimizer.optimizer_node(data)
    leaves, run_speed = monitors.run_settings(data)
    speed += more_speed + zero_speed + optimizer_speed + run_speed
    math += more_math + zero_math
    if math:
        raise ValueError(f"deepspeed_config: {', '.join(math)} change(s) what is trained and is not supported here "
                         "(remove it, or train with DeepSpeed)")
    train, micro, accum = batch.batch_sizes(data, world_size, world_from)
    leaves.update({"data.batch_size": micro, "trainer.accumulate_grad_batches": accum, "data.global_batch_size": train})
    nodes = {"precision": precision_node}
    if optimizer_node is not None:
        nodes["optimizer"] = optimizer_node
    scheduler_node = optimizer.scheduler_node(data)
    if scheduler_node is not None:
        nodes["scheduler"] = scheduler_node
    return Mapped(leaves=leaves, nodes=nodes, strategy=(name, strategy_settings),
                  loggers=monitors.logger_settings(data, start_dir), speed_only=speed)
