"""Precision plugins: which dtype computes, which one holds the weights, and fp16 loss scaling.

==============  =======================================  ======================================
precision       compute                                  weights, gradients, optimizer state
==============  =======================================  ======================================
fp32            fp32                                     fp32
bf16-mixed      autocast to bf16 (matmuls, convs)        fp32
fp16-mixed      autocast to fp16 + dynamic loss scaling  fp32
bf16-true       bf16                                     bf16 (the module is converted)
==============  =======================================  ======================================

Under FSDP the mixed modes also set FSDP's mixed-precision policy (parameters gathered in the low
dtype, gradients reduced in fp32) unless ``strategy.param_dtype`` / ``reduce_dtype`` say otherwise.

Files: ``__init__.py`` (``Precision``: the mode, autocast, the module's dtype, the scaler's settings),
``loss_scaler.py`` (fp16's dynamic loss scaler, DeepSpeed's semantics, and its checkpoint state),
``scaler_state.py`` (the scaler's state as device tensors and its update rule, with no host read),
``fp16_step.py`` (the optimizer step under fp16: sync-free for optimizers that skip on a device flag).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-true")


_NO_CONTEXT = contextlib.nullcontext()  # (stateless: one object serves every step)

class Precision:
    """One of `PRECISIONS`; the loss-scaler knobs apply to ``fp16-mixed`` only (DeepSpeed's
    names: ``initial_scale_power``, ``loss_scale_window``, ``hysteresis``, ``min_loss_scale``,
    ``static_loss_scale``; see ``trainer/precision/loss_scaler.py``)."""

    def __init__(self, name: str = "fp32", **scaler_options: Any):
        if name not in PRECISIONS:
            raise ValueError(f"precision={name!r} is not one of {', '.join(PRECISIONS)}")
        if scaler_options and name != "fp16-mixed":
            raise ValueError(f"precision.{sorted(scaler_options)[0]} applies to precision=fp16-mixed only, not {name}")
        self.name = name
        self.scaler = None
        if name == "fp16-mixed":
            from trainer.precision.loss_scaler import DynamicLossScaler

            try:
                self.scaler = DynamicLossScaler(**scaler_options)
            except TypeError as error:
                raise ValueError(f"precision: {error} (options: initial_scale_power, loss_scale_window, hysteresis, "
                                 "min_loss_scale, static_loss_scale, consecutive_hysteresis)") from None

    @classmethod
    def from_any(cls, value: str | Precision | dict | None) -> Precision:
        if isinstance(value, Precision):
            return value
        if value is None:
            return cls()
        if isinstance(value, str):
            return cls(value)
        return cls(**value)

    @property
    def compute_dtype(self) -> torch.dtype:
        return {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16, "bf16-true": torch.bfloat16}.get(
            self.name, torch.float32
        )

    @property
    def mixed(self) -> bool:
        return self.name.endswith("-mixed")

    def convert_module(self, module: nn.Module) -> nn.Module:
        """``bf16-true``: the module's floating-point parameters and buffers in bf16."""
        if self.name == "bf16-true":
            module.to(torch.bfloat16)
        return module

    def convert_input(self, batch: Any) -> Any:
        """``bf16-true``: floating-point tensors of a batch in bf16 (integer ones, e.g. token ids, stay)."""
        if self.name != "bf16-true":
            return batch
        if isinstance(batch, torch.Tensor):
            return batch.to(torch.bfloat16) if batch.is_floating_point() else batch
        if isinstance(batch, dict):
            return {k: self.convert_input(v) for k, v in batch.items()}
        if isinstance(batch, (list, tuple)):
            converted = [self.convert_input(v) for v in batch]
            return type(batch)(*converted) if hasattr(batch, "_fields") else type(batch)(converted)
        return batch

    def autocast(self, device: torch.device) -> ContextManager:
        """Context for forward passes (training and validation steps)."""
        if not self.mixed:
            return _NO_CONTEXT
        return torch.autocast(device_type=device.type, dtype=self.compute_dtype)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.scaler is None else self.scaler.scale_loss(loss)

    def state_dict(self) -> dict:
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])

    def __repr__(self) -> str:
        return f"Precision({self.name!r})"
