"""``train_batch_size`` / ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps``, as in
DeepSpeed 0.19's ``DeepSpeedConfig._configure_train_batch_size``: a missing one follows from the others
and the world size (floor divisions, as there), then train = micro x accumulation x world must hold."""

from __future__ import annotations

from typing import Any

from trainer.deepspeed_config.values import integer

KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def batch_sizes(data: dict[str, Any], world_size: int, world_from: str) -> tuple[int, int, int]:
    """``(train_batch_size, micro_batch, accumulation)`` for ``world_size`` processes (``world_from`` says
    where that number comes from, for the errors)."""
    train, micro, accum = (None if data.get(k) is None else integer(data[k], k, minimum=1) for k in KEYS)
    if train is not None and micro is not None and accum is not None:
        implied, rest = divmod(train, micro * accum)
        if rest or implied != world_size:
            what = (f"the JSON implies world size {implied}" if not rest else
                    f"{train} is not a multiple of micro x accumulation = {micro * accum}, so no world size fits")
            raise ValueError(
                f"deepspeed_config: train_batch_size={train} != train_micro_batch_size_per_gpu={micro} x "
                f"gradient_accumulation_steps={accum} x world size {world_size} ({world_from}); {what}")
        return train, micro, accum
    if train is not None and micro is not None:
        accum = train // micro // world_size
    elif train is not None and accum is not None:
        micro = train // world_size // accum
    elif micro is not None and accum is not None:
        train = micro * accum * world_size
    elif train is not None:
        accum, micro = 1, train // world_size
    elif micro is not None:
        train, accum = micro * world_size, 1
    else:
        raise ValueError("deepspeed_config: give train_batch_size or train_micro_batch_size_per_gpu "
                         "(DeepSpeed needs one of them)")
    if micro < 1 or accum < 1 or train != micro * accum * world_size:
        given = ", ".join(f"{k}={data[k]}" for k in KEYS if data.get(k) is not None)
        raise ValueError(f"deepspeed_config: {given} do not fit world size {world_size} ({world_from}): "
                         f"train_batch_size must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                         f"x world size, and {train} != {micro} x {accum} x {world_size}")
    return train, micro, accum
