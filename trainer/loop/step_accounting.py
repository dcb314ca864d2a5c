"""A step's bookkeeping that must cost no host sync: token counts and the non-finite loss check.

Token counts are kept where they cost nothing: a Python running sum while ``training_step`` (or
``pipeline_loss``) returns Python ints, a device tensor once it returns tensors. A device tensor is
made from the Python sum only where one is needed (the token all-reduce of
``loss_normalization=tokens``, the tokens/s of logging steps) with ``torch.full``: the number is a
kernel argument, not a host-to-device copy that waits (``torch.as_tensor(n, device=cuda)`` does).

The non-finite loss check is decided late: each step ORs its losses' flags into a device tensor that
remembers the first bad step (and its epoch); the flag is read (one host sync) only when settled:
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


class NonfiniteLossWatch:
    """Remembers, on the device, the first step whose loss was not finite; :meth:`settle` raises.

    ``nan_only``: under fp16 loss scaling an infinite loss is an overflow the scaler handles (the
    step is skipped and the scale lowered), but a NaN loss is not something a lower scale fixes
    (the forward is not scaled): it stops the run like any non-finite loss in the other precisions.
    """

    def __init__(self, device: torch.device, nan_only: bool = False):
        self.device = device
        self.nan_only = nan_only
        self._step_flag: torch.Tensor | None = None
        self._first_step = torch.zeros((), dtype=torch.int64, device=device)  # 0: none yet
        self._first_epoch = torch.zeros((), dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor) -> None:
        """Note one micro-batch's loss (tensor ops only)."""
        loss = loss.detach()
        self.observe_flag(torch.isnan(loss) if self.nan_only else ~torch.isfinite(loss))

    def observe_flag(self, bad: torch.Tensor) -> None:
        bad = bad.reshape(()).to(self.device)
        self._step_flag = bad if self._step_flag is None else self._step_flag | bad

    def end_step(self, step: int, epoch: int) -> None:
        """Close step ``step`` (1-based) of ``epoch``: remember it if it was the first bad one."""
        if self._step_flag is None:
            return
        bad = self._step_flag.to(torch.int64) * (self._first_step == 0)
        self._first_step += bad * step
        self._first_epoch += bad * epoch
        self._step_flag = None

    def settle(self, rank: int, now: int) -> None:
        """Raise ``FloatingPointError`` if a step up to ``now`` had a non-finite loss (one host sync)."""
        step = int(self._first_step)
        if step:
            late = f" (noticed at step {now})" if now != step else ""
            raise FloatingPointError(
                f"non-finite training loss at step {step} (epoch {int(self._first_epoch)}) on rank {rank}{late}; "
                "lower the learning rate, clip gradients (trainer.gradient_clip_val), use fp32 / bf16, or set "
                "trainer.nonfinite_loss=ignore to train on regardless"
            )
