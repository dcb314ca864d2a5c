"""The loss scaler's state as 0-dim tensors on the loss's device, and its update as tensor math.

Why tensors: the overflow decision is a device value (the inf-norm of the gradients); deciding on
the host what to do with the scale would read it back (one host-device sync per optimizer step).
Here `ScalerState.update` folds the decision in with ``torch.where``, so the scale that the
next ``scale_loss`` multiplies by is computed on the device, and nothing is read until someone asks
for a number (logging steps, checkpoints): the properties of ``DynamicLossScaler``.

The rules are DeepSpeed's ``DynamicLossScaler`` ones, spelled out in trainer/precision/loss_scaler.py;
`ScalerState.update` follows them branch for branch (tests/test_loss_scaler_tensor.py compares
it with a plain-Python reference on random overflow sequences). The scale is a float64 tensor (the
Python float of the former host implementation: ``max(scale / 2, min_loss_scale)`` rounds the same);
the counters are int64.
"""

from __future__ import annotations

import torch

__all__ = ["ScalerState", "SCALE_FACTOR", "MAX_SCALE"]

SCALE_FACTOR = 2.0
"""The scale is halved on an overflow (hysteresis spent) and doubled after a clean window."""

MAX_SCALE = 2.0**126
"""Scales live in [2**-126, 2**126]: both ``S`` and ``1/S`` are normal float32 numbers."""

_COUNTERS = ("growth_tracker", "cur_hysteresis", "skipped_steps", "overflows", "consecutive_overflows")


class ScalerState:
    """Scale, growth tracker, hysteresis budget and the overflow counters as 0-dim device tensors.

    Args:
        scale: the starting scale.
        hysteresis: the full hysteresis budget (also the starting one).
        loss_scale_window: double the scale after this many consecutive clean steps.
        min_loss_scale: the lower bound of the scale.
        consecutive_hysteresis: refill the hysteresis budget after every clean step (True) or only
            when the scale is raised (False).
        dynamic: False for a static scale (only the counters move).
    """

    def __init__(self, scale: float, hysteresis: int, loss_scale_window: int, min_loss_scale: float,
                 consecutive_hysteresis: bool, dynamic: bool):
        self.hysteresis = hysteresis
        self.loss_scale_window = loss_scale_window
        self.min_loss_scale = min_loss_scale
        self.consecutive_hysteresis = consecutive_hysteresis
        self.dynamic = dynamic
        self.device = torch.device("cpu")
        self.scale = torch.tensor(float(scale), dtype=torch.float64)
        self.growth_tracker = torch.tensor(0, dtype=torch.int64)
        self.cur_hysteresis = torch.tensor(hysteresis, dtype=torch.int64)
        self.skipped_steps = torch.tensor(0, dtype=torch.int64)
        self.overflows = torch.tensor(0, dtype=torch.int64)
        self.consecutive_overflows = torch.tensor(0, dtype=torch.int64)

    def to(self, device: torch.device) -> None:
        """Move the state to ``device`` (once, at the first ``scale_loss``; a no-op afterwards)."""
        device = torch.device(device)
        if device == self.device:
            return
        # float64 where the device has it (MPS does not: float32 holds every power of two in range).
        scale_dtype = torch.float32 if device.type == "mps" else torch.float64
        self.scale = self.scale.to(device=device, dtype=scale_dtype)
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name).to(device))
        self.device = device

    def set(self, scale: float | None = None, **counters: int) -> None:
        """Overwrite the scale and/or counters with host values (loading a checkpoint)."""
        if scale is not None:
            self.scale = torch.full((), float(scale), dtype=self.scale.dtype, device=self.device)
        for name, value in counters.items():
            if name not in _COUNTERS:
                raise KeyError(name)
            setattr(self, name, torch.full((), int(value), dtype=torch.int64, device=self.device))

    def update(self, found_inf: torch.Tensor) -> None:
        """One optimizer step's accounting; ``found_inf``: a 0-dim (or 1-element) bool / 0-1 tensor, true
        when the step overflowed (and was skipped). Tensor math only: no host read.

        Overflow: counted; dynamic mode: a budget > 1 is decremented (scale kept), else the scale is
        halved (not below ``min_loss_scale``); the clean-step count restarts. Clean step: the
        consecutive count restarts; dynamic mode counts it (refilling the budget with
        ``consecutive_hysteresis``); the ``loss_scale_window``-th one doubles the scale (up to 2**126),
        refills the budget and restarts the count."""
        found = found_inf.reshape(()).to(device=self.device, dtype=torch.bool)
        one = found.to(torch.int64)
        self.skipped_steps = self.skipped_steps + one
        self.overflows = self.overflows + one
        self.consecutive_overflows = (self.consecutive_overflows + 1) * one
        if not self.dynamic:
            return
        clean = found.logical_not()
        budget_left = self.cur_hysteresis > 1
        halve = found & budget_left.logical_not()
        hysteresis = torch.where(found & budget_left, self.cur_hysteresis - 1, self.cur_hysteresis)
        halved = torch.clamp(self.scale / SCALE_FACTOR, min=self.min_loss_scale)
        scale = torch.where(halve, halved, self.scale)
        if self.consecutive_hysteresis:
            hysteresis = torch.where(clean, torch.full_like(hysteresis, self.hysteresis), hysteresis)
        tracker = (self.growth_tracker + 1) * clean.to(torch.int64)  # an overflow restarts the count
        grow = clean & (tracker >= self.loss_scale_window)
        self.scale = torch.where(grow, torch.clamp(scale * SCALE_FACTOR, max=MAX_SCALE), scale)
        self.cur_hysteresis = torch.where(grow, torch.full_like(hysteresis, self.hysteresis), hysteresis)
        self.growth_tracker = torch.where(grow, torch.zeros_like(tracker), tracker)
