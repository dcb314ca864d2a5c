"""Reading a DeepSpeed JSON file and sorting its keys: mapped here, only tuning speed (one warning),
or changing the math in a way we do not reproduce (an error naming them)."""

from __future__ import annotations

import json
from typing import Any

# Keys of DeepSpeed 0.19's config (deepspeed/runtime/config.py, constants.py) that only tune speed, memory
# or DeepSpeed's own logs and checkpoints: not reproduced here, the run trains the same.
SPEED_ONLY = {
    "prescale_gradients", "gradient_predivide_factor", "disable_allgather", "dump_state", "disable_python_gc",
    "memory_breakdown", "flops_profiler", "autotuning", "comms_logger", "timers", "checkpoint", "aio", "compile",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "vocabulary_size", "log_level", "comet",
    "seq_parallel_communication_data_type", "use_data_before_expert_parallelism", "datastates", "pipeline",
    "hybrid_engine",
}
# Top-level keys mapped onto our settings (see the README's table).
MAPPED = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16", "bfloat16",
    "zero_optimization", "optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
    "activation_checkpointing", "tensorboard", "wandb", "csv_monitor", "dataloader_drop_last",
}


def _is_default(key: str, value: Any) -> bool:
    """Keys that change the math unless left at DeepSpeed's default (then they are harmless)."""
    if isinstance(value, dict) and "enabled" in value and len(value) == 1:
        return value["enabled"] is False
    return {
        "communication_data_type": value in (None, "fp32"),
        "gradient_allreduce_op": value == "mean",
        "managed_gradient_accumulation": value is True,
        "sequence_parallel_size": value == 1,
        "torch_autocast": isinstance(value, dict) and not value.get("enabled", False),
        "data_types": value in ({}, None),
        "data_efficiency": isinstance(value, dict) and not value.get("enabled", False),
    }.get(key, False)


def read_json(path: str) -> dict[str, Any]:
    """The file's object. Duplicate keys are an error (as in DeepSpeed), and so is HF Trainer's ``"auto"``
    placeholder anywhere (the HF integration fills those in; here give the number)."""
    def no_duplicates(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"deepspeed_config {path}: duplicate key(s) {', '.join(twice)}")
        return dict(pairs)

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=no_duplicates)
    except FileNotFoundError:
        raise ValueError(f"deepspeed_config={path}: no such file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"deepspeed_config={path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"deepspeed_config={path}: the file must hold a JSON object, got {type(data).__name__}")
    auto = [name for name, value in _leaves(data) if value == "auto"]
    if auto:
        raise ValueError(f"deepspeed_config {path}: {', '.join(auto)} = \"auto\" (a placeholder the HF Trainer fills "
                         "in); give the value")
    return data


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [(prefix[:-1], node)]


def sort_top_level(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(speed_only, changes_math)``: the top-level keys not mapped, by kind. Unknown keys count as
    changing the math (a key we cannot tell about is not dropped silently)."""
    speed, math = [], []
    for key, value in data.items():
        if key in MAPPED:
            continue
        if key in SPEED_ONLY or _is_default(key, value):
            speed.append(key)
        else:
            math.append(key)
    return speed, math


def sub_keys(data: dict[str, Any], block: str, known: set[str]) -> list[str]:
    """``block.key`` for each key of ``data[block]`` not in ``known``."""
    node = data.get(block)
    if not isinstance(node, dict):
        return []
    return [f"{block}.{key}" for key in node if key not in known]
