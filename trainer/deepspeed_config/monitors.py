"""``tensorboard`` / ``wandb`` / ``csv_monitor`` -> our loggers, and the run-level keys
(``gradient_clipping``, ``steps_per_print``, ``wall_clock_breakdown``, ``activation_checkpointing``,
``dataloader_drop_last``) -> trainer / data settings."""

from __future__ import annotations

import os
from typing import Any

from trainer.deepspeed_config.values import block, flag, integer, number

# DeepSpeed 0.19's monitor/config.py: the keys and defaults of each block.
MONITOR_KEYS = {"tensorboard": {"enabled", "output_path", "job_name"}, "csv_monitor": {"enabled", "output_path", "job_name"},
                "wandb": {"enabled", "group", "team", "project"}}
OUR_LOGGER = {"tensorboard": "tensorboard", "csv_monitor": "csv", "wandb": "wandb"}


def logger_settings(data: dict[str, Any], start_dir: str = ".") -> dict[str, dict[str, Any] | None]:
    """Our logger name -> its options (None: not selected) for the three monitor blocks. DeepSpeed writes
    TensorBoard events and CSV files to ``<output_path>/<job_name>/`` (output_path relative to the
    directory the run starts in, ``start_dir``; job_name "DeepSpeedJobName" by default): so does this (an absolute
    ``log_dir``, fixed when the config is read). Our CSV logger writes one ``metrics.csv`` there (DeepSpeed
    writes a file per metric)."""
    settings: dict[str, dict[str, Any] | None] = {}
    for name, keys in MONITOR_KEYS.items():
        node = block(data, name)
        unknown = [k for k in node if k not in keys]
        if unknown:
            raise ValueError(f"deepspeed_config: {name}.{unknown[0]} is not a key of DeepSpeed's {name} block "
                             f"({', '.join(sorted(keys))})")
        if not flag(node, "enabled", name):
            settings[OUR_LOGGER[name]] = None
        elif name == "wandb":
            settings["wandb"] = {"project": node.get("project", "deepspeed"), "group": node.get("group"),
                                 "entity": node.get("team")}
        else:
            path = os.path.join(node.get("output_path", ""), node.get("job_name", "DeepSpeedJobName"))
            settings[OUR_LOGGER[name]] = {"log_dir": os.path.abspath(os.path.join(start_dir, path))}
    return settings


def run_settings(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(dotted config path -> value, speed_only_keys)`` for the run-level keys. Omitted keys take
    DeepSpeed's defaults (gradient_clipping 1.0; wall_clock_breakdown false; no activation checkpointing),
    except steps_per_print (DeepSpeed's default prints nothing): then trainer.log_every_n_steps stays."""
    values: dict[str, Any] = {}
    clip = number(data.get("gradient_clipping", 1.0), "gradient_clipping", minimum=0)
    values["trainer.gradient_clip_val"] = clip if clip > 0 else None  # DeepSpeed clips only when > 0
    if data.get("steps_per_print") is not None:
        values["trainer.log_every_n_steps"] = integer(data["steps_per_print"], "steps_per_print", minimum=1)
    values["trainer.profile.wall_clock_breakdown"] = flag(data, "wall_clock_breakdown", "deepspeed_config")
    checkpointing = data.get("activation_checkpointing")
    if checkpointing is not None and not isinstance(checkpointing, dict):
        raise ValueError(f"deepspeed_config: activation_checkpointing must be a JSON object, got {checkpointing!r}")
    values["trainer.activation_checkpointing"] = checkpointing is not None
    speed = [f"activation_checkpointing.{k}" for k in (checkpointing or {})]
    if "dataloader_drop_last" in data:
        values["data.drop_last"] = flag(data, "dataloader_drop_last", "deepspeed_config")
    return values, speed
