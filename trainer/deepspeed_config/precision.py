"""``fp16`` / ``bf16`` -> the ``precision`` group (DeepSpeed 0.19's ``precision_config.py`` defaults)."""

from __future__ import annotations

from typing import Any

from trainer.deepspeed_config.values import block, flag, integer, number

FP16_MAPPED = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
               "consecutive_hysteresis", "min_loss_scale", "auto_cast"}
BF16_MAPPED = {"enabled"}
BF16_SPEED = {"immediate_grad_update", "check_grad_overflow"}
# Keys that change the math when true (low-precision master weights / optimizer state).
FP16_MATH = {"fp16_master_weights_and_grads"}
BF16_MATH = {"bf16_master_weights_and_grads", "bf16_optimizer_states"}


def precision_node(data: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """``(node, speed_only_keys, math_keys)``: the ``precision`` config node the JSON means (fp32 when
    neither fp16 nor bf16 is enabled: DeepSpeed's default) and the sub-keys it does not map."""
    fp16 = block(data, "fp16")
    bf16_key = "bf16" if "bf16" in data else "bfloat16"  # DeepSpeed still reads the old name
    bf16 = block(data, bf16_key)
    speed = [f"{bf16_key}.{k}" for k in bf16 if k in BF16_SPEED]
    math = ([f"fp16.{k}" for k in fp16 if k in FP16_MATH and fp16[k]]
            + [f"{bf16_key}.{k}" for k in bf16 if k in BF16_MATH and bf16[k]])
    unknown = ([f"fp16.{k}" for k in fp16 if k not in FP16_MAPPED | FP16_MATH]
               + [f"{bf16_key}.{k}" for k in bf16 if k not in BF16_MAPPED | BF16_SPEED | BF16_MATH])
    fp16_on, bf16_on = flag(fp16, "enabled", "fp16"), flag(bf16, "enabled", bf16_key)
    if fp16_on and bf16_on:
        raise ValueError(f"deepspeed_config: fp16.enabled and {bf16_key}.enabled are both true; enable one")
    node: dict[str, Any] = {"_target_": "trainer.precision.Precision", "name": "fp32"}
    if bf16_on:
        node["name"] = "bf16-mixed"
    elif fp16_on:
        loss_scale = number(fp16.get("loss_scale", 0), "fp16.loss_scale", minimum=0)
        power = integer(fp16.get("initial_scale_power", 16), "fp16.initial_scale_power", 0, 126)
        node.update(
            name="fp16-mixed",
            initial_scale_power=power,
            loss_scale_window=integer(fp16.get("loss_scale_window", 1000), "fp16.loss_scale_window", minimum=1),
            hysteresis=integer(fp16.get("hysteresis", 2), "fp16.hysteresis", minimum=1),
            min_loss_scale=number(fp16.get("min_loss_scale", 1), "fp16.min_loss_scale", minimum=0, strictly=True),
            consecutive_hysteresis=flag(fp16, "consecutive_hysteresis", "fp16"),
            static_loss_scale=None if loss_scale == 0 else loss_scale,  # DeepSpeed: 0 = dynamic
        )
        flag(fp16, "auto_cast", "fp16")  # autocast casts every op's inputs already: true and false train alike
    return node, speed, math + unknown
