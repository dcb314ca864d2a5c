"""``optimizer`` and ``scheduler`` -> the ``optimizer`` / ``scheduler`` groups, with DeepSpeed 0.19's
meaning (``DeepSpeedEngine._configure_basic_optimizer`` / ``_scheduler_from_config``).

Adam and AdamW: DeepSpeed builds FusedAdam (or DeepSpeedCPUAdam under offload) with ``adam_w_mode``
(default true): type "AdamW" is always decoupled weight decay (torch.optim.AdamW), type "Adam" is too
unless ``adam_w_mode: false`` (then L2 weight decay: torch.optim.Adam). FusedAdam's defaults hold for
omitted params (``weight_decay`` 0, not torch AdamW's 0.01), except with ``torch_adam: true``, where
DeepSpeed calls torch's class itself and torch's defaults hold. Any other type is looked up in
torch.optim (as DeepSpeed does), e.g. "SGD" with torch's defaults; DeepSpeed's own Lamb, Lion, Muon,
OneBit* and mu* optimizers are refused.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.deepspeed_config.schedulers import SCHEDULERS
from trainer.deepspeed_config.values import block, flag

ADAM_TYPES = ("adam", "adamw")
# DeepSpeed's own optimizers (lower-cased names it recognises) that have no torch equivalent here.
REFUSED = ("lamb", "lion", "muon", "muadam", "muadamw", "musgd", "onebitadam", "zerooneadam", "onebitlamb")
FUSED_ADAM_DEFAULTS = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
_ADAM_SPEED = ("fp32_optimizer_states", "foreach", "set_grad_none")  # implementation choices, same math


def optimizer_node(data: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``(node, speed_only_keys)``; node None when the JSON has no optimizer (DeepSpeed then uses the
    client's: here the composed ``optimizer`` group stays)."""
    spec = block(data, "optimizer")
    if not spec:
        return None, []
    unknown = [k for k in spec if k not in ("type", "params", "legacy_fusion")]
    if unknown:
        raise ValueError(f"deepspeed_config: optimizer.{unknown[0]} is not a DeepSpeed optimizer key (type, params)")
    kind = spec.get("type")
    if not isinstance(kind, str):
        raise ValueError(f"deepspeed_config: optimizer.type must be a name (Adam, AdamW, SGD, ...), got {kind!r}")
    params = dict(block(spec, "params"))
    speed = ["optimizer.legacy_fusion"] if "legacy_fusion" in spec else []
    if "max_grad_norm" in params:  # DeepSpeed raises the same
        raise ValueError("deepspeed_config: optimizer.params.max_grad_norm is not supported; use gradient_clipping")
    if kind.lower() in ADAM_TYPES:
        return _adam(kind, params, speed), speed
    if kind.lower() in REFUSED:
        raise ValueError(f"deepspeed_config: optimizer.type={kind!r} (a DeepSpeed optimizer) is not supported; "
                         "use Adam, AdamW, SGD or another torch.optim class")
    name = "Adagrad" if kind.lower() == "adagrad" else kind  # DeepSpeed maps "adagrad" to torch's Adagrad
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"deepspeed_config: optimizer.type={kind!r} is neither Adam / AdamW nor a torch.optim "
                         "class (e.g. SGD, RMSprop; names are case-sensitive, as in DeepSpeed)")
    return {"_target_": f"torch.optim.{name}", "_partial_": True, **params}, speed


def _adam(kind: str, params: dict[str, Any], speed: list[str]) -> dict[str, Any]:
    where = "optimizer.params"
    adam_w_mode = flag(params, "adam_w_mode", where, default=True)
    torch_adam = flag(params, "torch_adam", where)
    decoupled = kind.lower() == "adamw" or adam_w_mode  # DeepSpeed's effective_adam_w_mode
    if not flag(params, "bias_correction", where, default=True):
        raise ValueError("deepspeed_config: optimizer.params.bias_correction=false is not supported "
                         "(torch's Adam / AdamW always correct the bias)")
    if flag(params, "amsgrad", where) and not torch_adam:
        raise ValueError("deepspeed_config: optimizer.params.amsgrad=true: DeepSpeed's FusedAdam refuses it too "
                         "(it works with torch_adam=true)")
    for key in ("adam_w_mode", "torch_adam", "bias_correction"):
        params.pop(key, None)
    speed += [f"{where}.{k}" for k in _ADAM_SPEED if params.pop(k, None) is not None]
    target = "torch.optim.AdamW" if decoupled else "torch.optim.Adam"
    defaults = {} if torch_adam else FUSED_ADAM_DEFAULTS  # torch_adam: torch's own defaults
    return {"_target_": target, "_partial_": True, **defaults, **params}


def scheduler_node(data: dict[str, Any]) -> dict[str, Any] | None:
    """The ``scheduler`` node; None when the JSON has none (the composed ``scheduler`` group stays, as
    DeepSpeed keeps the client's)."""
    spec = block(data, "scheduler")
    if not spec:
        return None
    kind = spec.get("type")
    params = dict(block(spec, "params"))
    unknown = [k for k in spec if k not in ("type", "params")]
    if unknown:
        raise ValueError(f"deepspeed_config: scheduler.{unknown[0]} is not a DeepSpeed scheduler key (type, params)")
    if kind in SCHEDULERS:
        if params.pop("last_batch_iteration", -1) != -1:
            raise ValueError("deepspeed_config: scheduler.params.last_batch_iteration other than -1 is not "
                             "supported; a resumed run continues its schedule from the checkpoint (trainer.resume)")
        return {"_target_": f"trainer.deepspeed_config.schedulers.{kind}", "_partial_": True, **params}
    cls = getattr(torch.optim.lr_scheduler, kind, None) if isinstance(kind, str) else None
    if kind in ("OneCycle", "LRRangeTest") or not isinstance(cls, type):
        raise ValueError(f"deepspeed_config: scheduler.type={kind!r} is not supported; use WarmupLR, WarmupDecayLR, "
                         "WarmupCosineLR or a torch.optim.lr_scheduler class")
    return {"_target_": f"torch.optim.lr_scheduler.{kind}", "_partial_": True, **params}
