"""``zero_optimization`` -> the ``strategy`` group: stage 0 -> ddp, 1 -> ddp with zero1, 2 -> fsdp
grad_op, 3 -> fsdp full; ``offload_param`` + ``offload_optimizer`` (device cpu) -> fsdp's cpu_offload."""

from __future__ import annotations

from typing import Any

from trainer.deepspeed_config.values import integer

MAPPED = {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"}
# Sub-keys that change what is computed when set (quantized weights / gradients, ZenFlow's optimizer).
MATH = {"zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights", "zenflow"}
STAGES = {0: ("ddp", {"zero1": False}), 1: ("ddp", {"zero1": True}),
          2: ("fsdp", {"sharding": "grad_op"}), 3: ("fsdp", {"sharding": "full"})}


def _offload_device(zero: dict[str, Any], key: str, deprecated: str) -> str | None:
    """``cpu`` / None for ``zero_optimization.<key>`` (or its deprecated boolean ``<deprecated>``)."""
    node = zero.get(key)
    if node is None and zero.get(deprecated) is True:
        return "cpu"
    if node is None:
        return None
    if not isinstance(node, dict):
        raise ValueError(f"deepspeed_config: zero_optimization.{key} must be a JSON object, got {node!r}")
    device = node.get("device", "none")
    if device == "none":
        return None
    if device != "cpu":
        raise ValueError(f"deepspeed_config: zero_optimization.{key}.device={device!r} is not supported; "
                         "use \"cpu\" (fsdp's cpu_offload) or \"none\"")
    return "cpu"


def strategy_choice(data: dict[str, Any]) -> tuple[str, dict[str, Any], list[str], list[str]]:
    """``(strategy name, its settings, speed_only_keys, math_keys)`` for ``zero_optimization``
    (DeepSpeed's default when omitted: stage 0)."""
    zero = data.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated form: true = stage 1
        zero = {"stage": 1 if zero else 0}
    if not isinstance(zero, dict):
        raise ValueError(f"deepspeed_config: zero_optimization must be a JSON object, got {zero!r}")
    stage = integer(zero.get("stage", 0), "zero_optimization.stage", 0, 3)
    math = [f"zero_optimization.{k}" for k in zero if k in MATH and zero[k] not in (False, None, {})]
    speed = [f"zero_optimization.{k}" for k in zero if k not in MAPPED | MATH]
    param = _offload_device(zero, "offload_param", "cpu_offload_param")
    optimizer = _offload_device(zero, "offload_optimizer", "cpu_offload")
    if optimizer and not param:
        raise ValueError("deepspeed_config: zero_optimization.offload_optimizer without offload_param is not "
                         "supported (fsdp's cpu_offload moves parameters and optimizer state together); add "
                         "\"offload_param\": {\"device\": \"cpu\"} with stage 3, or remove offload_optimizer")
    if param and stage != 3:
        raise ValueError(f"deepspeed_config: zero_optimization.offload_param needs stage 3 (as in DeepSpeed), "
                         f"got stage {stage}")
    name, settings = STAGES[stage]
    settings = dict(settings)
    if name == "fsdp":
        settings["cpu_offload"] = bool(param)
    return name, settings, speed, math
