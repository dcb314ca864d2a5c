"""A step's bookkeeping that must cost no host sync: token counts and the non-finite loss check.

Token counts are kept where they cost nothing: a Python running sum while ``training_step`` (or
``pipeline_loss``) returns Python ints, a device tensor once it returns tensors. A device tensor is
made from the Python sum only where one is needed (the token all-reduce of
``loss_normalization=tokens``, the tokens/s of logging steps) with ``torch.full``: the number is a
kernel argument, not a host-to-device copy that waits (``torch.as_tensor(n, device=cuda)`` does).

The non-finite loss check is decided late: the losses of a window of steps are checked together on
the device, into a tensor that remembers the first bad step (and its epoch); it is read (one host sync) only when settled:
on logging steps, before validation and before any checkpoint is saved (so a NaN state is never
committed), and at the end of training. The error still names the step where it happened.
"""

from __future__ import annotations

from typing import Any

import torch


class TokenCount:
    """A running count of tokens: Python while the counts are Python numbers, else on ``device``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.python: float = 0
        self.tensor: torch.Tensor | None = None

    def add(self, count: Any) -> None:
        if isinstance(count, torch.Tensor):
            count = count.detach().to(device=self.device, dtype=torch.float64)
            self.tensor = count if self.tensor is None else self.tensor + count
        else:
            self.python += count

    def total(self) -> torch.Tensor:
        """The count as a float64 device tensor (a fresh one: callers may reduce it in place)."""
        python = torch.full((), float(self.python), dtype=torch.float64, device=self.device)
        return python if self.tensor is None else python + self.tensor

    def reset(self) -> None:
        self.python, self.tensor = 0, None


def counted(count: Any, counts: bool) -> Any:
    """``count`` if the micro-batch counts, else zero (a padding micro-batch), without a sync."""
    if counts:
        return count
    return count * 0 if isinstance(count, torch.Tensor) else 0


_WINDOW_STEPS = 64  # steps whose losses are checked together, on the device


class NonfiniteLossWatch:
    """Remembers, on the device, the first step whose loss was not finite; `settle` raises.

    A micro-batch's loss costs no kernel on its step: its detached value is kept, and the losses of
    up to 64 consecutive steps (one epoch, as many micro-batches each) are checked together, in a
    handful of tensor ops that note the first bad step on the device; a window is checked when it is
    full, when the next step does not continue it, and when the check is settled.

    ``nan_only``: under fp16 loss scaling an infinite loss is an overflow the scaler handles (the
    step is skipped and the scale lowered), but a NaN loss is not something a lower scale fixes
    (the forward is not scaled): it stops the run like any non-finite loss in the other precisions.
    """

    def __init__(self, device: torch.device, nan_only: bool = False):
        self.device = device
        self.nan_only = nan_only
        self._losses: list[torch.Tensor] = []  # the window's losses, then the current step's
        self._step_losses = 0  # how many of them the current step observed
        self._window: list[int] | None = None  # [first step, epoch, losses per step, steps] of the window
        self._first_step = torch.zeros((), dtype=torch.int64, device=device)  # 0: none yet
        self._first_epoch = torch.zeros((), dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor) -> None:
        """Note one micro-batch's loss (no kernel: checked with its window)."""
        self._losses.append(loss.detach())
        self._step_losses += 1

    def drop_step(self) -> None:
        """The current step was abandoned before its optimizer step: its losses are not checked."""
        if self._step_losses:
            del self._losses[len(self._losses) - self._step_losses:]
            self._step_losses = 0

    def end_step(self, step: int, epoch: int) -> None:
        """Close step ``step`` (1-based) of ``epoch``: its losses join the window (checked when it closes)."""
        count, self._step_losses = self._step_losses, 0
        if count == 0:
            return
        window = self._window
        if window is not None and (step != window[0] + window[3] or epoch != window[1] or count != window[2]):
            self._check(len(self._losses) - count)  # the window so far, without this step
            window = None
        if window is None:
            self._window = window = [step, epoch, count, 0]
        window[3] += 1
        if window[3] == _WINDOW_STEPS:
            self._check(len(self._losses))

    def _check(self, upto: int) -> None:
        """Check the window's first ``upto`` losses (tensor ops, no host read) and close the window."""
        losses, self._losses = self._losses[:upto], self._losses[upto:]
        first_step, epoch, per_step, _ = self._window
        self._window = None
        values = torch.stack([loss if loss.dim() == 0 else loss.reshape(()) for loss in losses])  # (reshape: ~1 us each)
        # (0 * inf is NaN: a non-finite loss gives NaN, a finite one 0)
        bad = values.isnan() if self.nan_only else values.mul(0).isnan()
        first = bad.to(torch.uint8).argmax()  # the first bad loss, where there is one
        new = bad.any() & (self._first_step == 0)
        step = torch.div(first, per_step, rounding_mode="floor").add_(first_step).to(self._first_step.device)
        self._first_step = torch.where(new.to(self._first_step.device), step, self._first_step)
        self._first_epoch = torch.where(new.to(self._first_epoch.device), epoch, self._first_epoch)

    def settle(self, rank: int, now: int) -> None:
        """Raise ``FloatingPointError`` if a step up to ``now`` had a non-finite loss (one host sync)."""
        if self._window is not None:
            self._check(len(self._losses) - self._step_losses)
        step = int(self._first_step)
        if step:
            late = f" (noticed at step {now})" if now != step else ""
            raise FloatingPointError(
                f"non-finite training loss at step {step} (epoch {int(self._first_epoch)}) on rank {rank}{late}; "
                "lower the learning rate, clip gradients (trainer.gradient_clip_val), use fp32 / bf16, or set "
                "trainer.nonfinite_loss=ignore to train on regardless"
            )
