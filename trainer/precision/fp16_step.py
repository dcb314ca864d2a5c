"""fp16's optimizer step without a host read, where the optimizer can skip on a device flag.

Optimizers that support AMP step scaling (``_step_supports_amp_scaling``: fused Adam / AdamW / SGD,
on CPU too) read two optional tensor attributes in ``step()``: ``found_inf`` (skip the update where
it is nonzero, inside the kernel, and leave the step counts as they were) and ``grad_scale`` (divide
the gradients by it first). torch.amp.GradScaler sets them around ``optimizer.step()``; so does
`sync_free_step`, with ``found_inf`` only: the scaler has already unscaled the gradients (in
float32 math, exactly; gradient clipping needs them unscaled anyway).

The cost of not reading the flag: the host does not know that a step was skipped. The trainer then
advances the LR schedule on a skipped step too (as torch.amp.GradScaler and Lightning do), and
reports skipped steps on logging steps (`SkipReport`). A logging step reads the flag before
the hook (`Fp16Steps.overflowed`): a skipped one fires no ``on_before_optimizer_step``, clips
nothing and logs ``train/grad_norm`` as inf; a quiet one runs both and the kernel skips. Other optimizers keep the host read
(one per optimizer step) and a skipped step does not advance the schedule; `announce` says
which path a run takes, once, at its start.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

__all__ = ["supports_sync_free", "sync_free_step", "read_finite", "announce", "SkipReport", "Fp16Steps"]

log = logging.getLogger(__name__)


def supports_sync_free(optimizer: Any) -> bool:
    """Whether ``optimizer`` (the one that actually steps: ``strategy.stepping_optimizer``) skips its
    update on a device ``found_inf`` flag."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def sync_free_step(stepping: torch.optim.Optimizer, found_inf: torch.Tensor, step: Callable[[], Any]) -> None:
    """Run ``step()`` (which steps ``stepping``, possibly through a wrapper such as ZeRO-1's) with
    ``stepping.found_inf`` set: the kernel leaves parameters and state untouched where the flag is 1.
    No host read."""
    stepping.found_inf = found_inf  # type: ignore[attr-defined]
    try:
        step()
    finally:
        del stepping.found_inf  # type: ignore[attr-defined]


def read_finite(found_inf: torch.Tensor) -> bool:
    """The host path's one read per optimizer step: True when the step may be taken (no overflow)."""
    return found_inf.item() == 0.0


def announce(steppings: list[Any], rank: int) -> bool:
    """Log once (rank 0) which fp16 step path the run takes; True when every optimizer is sync-free."""
    sync_free = all(supports_sync_free(o) for o in steppings)
    if rank == 0:
        if sync_free:
            log.info("fp16: the optimizer skips overflowing steps on the device (no host read per step); "
                     "a skipped step still advances the LR schedule (as torch.amp.GradScaler); skipped "
                     "steps are reported on logging steps")
        else:
            names = ", ".join(sorted({type(o).__name__ for o in steppings if not supports_sync_free(o)}))
            log.info("fp16: %s cannot skip a step on a device flag, so the overflow decision is read to the "
                     "host every optimizer step (one device sync); fused=True (Adam, AdamW, SGD) avoids it",
                     names)
    return sync_free


class SkipReport:
    """The sync-free path's overflow log line, on logging steps: how many steps were skipped since the
    previous report, and the scale now (both read there, where the step reads the metrics anyway)."""

    def __init__(self) -> None:
        self._reported = 0

    def sync(self, skipped_steps: int) -> None:
        """Start from ``skipped_steps`` (after a resume, so restored skips are not reported again)."""
        self._reported = skipped_steps

    def report(self, step: int, skipped_steps: int, scale: float) -> None:
        new, self._reported = skipped_steps - self._reported, skipped_steps
        if new > 0:
            log.info("step %d: %d step%s skipped for a gradient overflow since the last log, loss scale now %g",
                     step, new, "" if new == 1 else "s", scale)


class Fp16Steps:
    """The loop's fp16 step, one per run (after the optimizers exist and a resume restored the scaler).

    Args:
        scaler: the run's ``DynamicLossScaler``.
        strategy: the run's strategy (``stepping_optimizer`` finds the optimizer that steps under a
            wrapper such as ZeRO-1's).
        optimizers: the run's optimizers (one, or the list under manual optimization).
        rank: this rank (rank 0 says which path the run takes).
    """

    def __init__(self, scaler: Any, strategy: Any, optimizers: Any, rank: int):
        self.scaler, self.strategy = scaler, strategy
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        self.sync_free = announce([strategy.stepping_optimizer(o) for o in optimizers], rank)
        self._report = SkipReport()
        if self.sync_free:
            self._report.sync(scaler.skipped_steps)  # (one read, at the start)

    def decide(self, found_inf: torch.Tensor) -> bool:
        """Whether the host takes the step: True in the sync-free path (the kernel skips an overflow),
        else the flag read to the host (the one sync per step). Also updates the scaler (no read)."""
        self.scaler.update(found_inf)
        return True if self.sync_free else read_finite(found_inf)

    def overflowed(self, found_inf: torch.Tensor) -> bool:
        """Whether this step overflowed, read to the host (one sync: callers ask on logging steps only,
        or where the host path has read it already)."""
        return not read_finite(found_inf)

    def step(self, optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
        """``strategy.optimizer_step(optimizer)``, skipping on ``found_inf`` in the kernel where sync-free."""
        if self.sync_free:
            sync_free_step(self.strategy.stepping_optimizer(optimizer), found_inf,
                           lambda: self.strategy.optimizer_step(optimizer))
        else:
            self.strategy.optimizer_step(optimizer)

    def on_logging_step(self, step: int, metrics: dict[str, float]) -> None:
        """Add the scale and the skipped-step count to a logging step's metrics (host reads, there);
        sync-free path: log the steps skipped since the previous logging step."""
        scale, skipped = self.scaler.scale, self.scaler.skipped_steps
        metrics["train/loss_scale"] = scale
        metrics["train/skipped_steps"] = skipped
        if self.sync_free:
            self._report.report(step, skipped, scale)
