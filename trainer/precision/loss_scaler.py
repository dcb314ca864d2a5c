"""Dynamic loss scaling for fp16 mixed precision, with DeepSpeed's ``DynamicLossScaler`` semantics.

Why scale at all: fp16 keeps 5 exponent bits, so gradient values below about 2**-24 round to zero
(and below 2**-14 lose precision). Multiplying the loss by a scale ``S`` multiplies every gradient
by ``S`` (backward is linear), which lifts small gradients into fp16's range; dividing the
gradients by ``S`` before the optimizer step restores their true values. Too large an ``S``
overflows to ``inf``/``nan``: that step is skipped (the optimizer never sees the bad gradients)
and ``S`` is lowered. After a long enough run of clean steps ``S`` is raised again, to probe for
the largest scale that does not overflow.

One optimizer step over K micro-batches::

    for micro_batch in micro_batches:
        scaler.scale_loss(loss).backward()             # loss * S, a tensor op (no host sync)
    ok = scaler.unscale_(grads, strategy.all_reduce_max)  # grads /= S in place; all finite on every rank?
    if ok:
        clip_grad_norm(...); optimizer.step()
    scaler.update(found_inf=not ok)                    # adjusts S; counts the skipped step
    optimizer.zero_grad()

The knobs (``precision.<name>`` in the config; DeepSpeed's fp16 names):

``initial_scale_power`` (int in [0, 126], default 16)
    The scale starts at ``2**initial_scale_power``. Powers of two keep scaling and unscaling
    exact (they only move the exponent). A too-large start costs a few skipped steps at the
    beginning of a run while the scale comes down; a too-small one costs ``loss_scale_window``
    steps per doubling on the way up.

``loss_scale_window`` (int >= 1, default 1000)
    After this many consecutive clean steps since the last overflow or the last raise, the scale
    is doubled. Small windows probe aggressively (more skipped steps); large windows keep a scale
    that is lower than it could be for longer.

``hysteresis`` (int >= 1, default 2)
    How many overflows are needed to halve the scale: the first ``hysteresis - 1`` overflows only
    spend a budget (the step is still skipped, the scale stays). It makes one isolated spike cost
    one skipped step instead of a halved scale plus ``loss_scale_window`` steps to win it back.
    The budget is refilled when the scale is raised (and, with ``consecutive_hysteresis``, after
    every clean step); once it is spent, every further overflow halves the scale.

``consecutive_hysteresis`` (bool, default false)
    False (DeepSpeed's default): the hysteresis budget is refilled only when the scale is raised,
    so ``hysteresis`` overflows between two raises halve the scale, however far apart they are.
    True: every clean step refills it, so only ``hysteresis`` overflows *in a row* halve it.

``min_loss_scale`` (number in [2**-126, 2**initial_scale_power], default 1)
    The scale is never lowered below this. Overflowing steps at the minimum are still skipped and
    counted; a run stuck there shows up as a growing ``skipped_steps`` /
    ``consecutive_overflows`` (DeepSpeed raises an error instead, see below).

``static_loss_scale`` (null, or a number in [2**-126, 2**126]; default null)
    A number fixes the scale for the whole run (no growth, no halving; the three knobs above are
    then unused). Overflowing steps are still detected, skipped and counted. Null: dynamic scaling.

Why the overflow decision is all-reduced: every rank must take the same decision, or the replicas
diverge. Under FSDP / ZeRO each rank holds a different shard of the gradients, so an ``inf`` can sit
in one rank's shard only; that rank skipping while the others step would leave the model's shards
updated inconsistently, and the ranks' scalers would drift apart (different scales -> gradients
scaled differently on later steps). So each rank computes a local 0/1 flag, the flags are MAX-reduced
over all ranks, and one ``.item()`` on the result makes the common decision. That read is the only
host synchronisation the scaler adds (the optimizer step depends on it anyway).

Exactness: with power-of-two scales, ``unscale_`` is exact (unless a value underflows the gradient
dtype itself). Unscaling multiplies by ``1/S`` in the gradients' dtype math when ``1/S`` is exactly
representable there, else in float32 math (a float32 scalar tensor; PyTorch's CPU foreach kernels
would otherwise round the scalar to fp16 first, and 2**-30 becomes 0). Overflow detection uses the
max-norm (``torch._foreach_norm(..., inf)``), which is ``inf``/``nan`` exactly when some element is
and, unlike sum-based checks, cannot overflow on large finite values.

Differences to DeepSpeed's ``DynamicLossScaler`` (``deepspeed/runtime/fp16/loss_scaler.py``):

* DeepSpeed raises an error when it overflows while already at ``min_scale`` (its
  ``raise_error_at_min_scale=True`` default); here the scale stays at ``min_loss_scale`` and the
  step is skipped and counted, the run goes on.
* The scale never grows above ``2**126`` (so ``1/S`` stays a normal float32); DeepSpeed has no cap.
* DeepSpeed's ``loss_scale: 0`` means "dynamic"; here dynamic is ``static_loss_scale: null`` and 0
  is rejected.
* The scale factor is fixed at 2 (DeepSpeed's ``scale_factor`` is not exposed).
* Counting clean steps with ``growth_tracker`` (reset by an overflow and by a raise) is equivalent to
  DeepSpeed's ``(cur_iter - last_overflow_iter) % scale_window == 0`` test.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any, Callable, Iterable

import torch

try:  # only to unwrap DTensor gradients; the trainer normally passes local shards already
    from torch.distributed.tensor import DTensor as _DTensor
except Exception:  # pragma: no cover - builds without torch.distributed
    _DTensor = None

__all__ = ["DynamicLossScaler", "SCALE_FACTOR", "MAX_SCALE_POWER"]

SCALE_FACTOR = 2.0
"""The scale is halved on an overflow (hysteresis spent) and doubled after a clean window."""

MAX_SCALE_POWER = 126
"""Scales live in [2**-126, 2**126]: both ``S`` and ``1/S`` are normal float32 numbers."""

_MIN_SCALE = 2.0**-MAX_SCALE_POWER
_MAX_SCALE = 2.0**MAX_SCALE_POWER
_STATE_VERSION = 1
_INT_STATE_KEYS = ("growth_tracker", "cur_hysteresis", "skipped_steps", "overflows", "consecutive_overflows")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _exactly_representable(value: float, dtype: torch.dtype) -> bool:
    """Whether ``value`` survives a round trip through ``dtype`` (pure Python: no tensor, no sync)."""
    if dtype == torch.float64:
        return True
    try:
        as_f32 = struct.unpack("f", struct.pack("f", value))[0]
        if dtype == torch.float32:
            return as_f32 == value
        if dtype == torch.float16:
            return struct.unpack("e", struct.pack("e", value))[0] == value
        if dtype == torch.bfloat16:  # float32's exponent range, top 16 bits of its pattern
            return as_f32 == value and struct.unpack("<I", struct.pack("<f", value))[0] & 0xFFFF == 0
    except (OverflowError, struct.error):
        return False
    return False


class DynamicLossScaler:
    """DeepSpeed-style dynamic (or static) loss scaler for fp16 mixed precision.

    See the module docstring for what each knob does. Bad values raise ``ValueError`` naming the
    option as written in the config (``precision.<name>``) and its allowed range.

    Args:
        initial_scale_power: the scale starts at ``2**initial_scale_power``; an int in [0, 126].
        loss_scale_window: double the scale after this many consecutive clean steps; int >= 1.
        hysteresis: overflows needed to halve the scale; int >= 1 (1: every overflow halves).
        min_loss_scale: lower bound of the scale; a number in [2**-126, 2**initial_scale_power].
        static_loss_scale: ``None`` for dynamic scaling, or a fixed scale in [2**-126, 2**126].
        consecutive_hysteresis: refill the hysteresis budget after every clean step (True) or
            only when the scale is raised (False, DeepSpeed's default).
    """

    def __init__(
        self,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: float = 1.0,
        static_loss_scale: float | None = None,
        consecutive_hysteresis: bool = False,
    ):
        if not _is_int(initial_scale_power) or not 0 <= initial_scale_power <= MAX_SCALE_POWER:
            raise ValueError(
                f"precision.initial_scale_power must be an integer in [0, {MAX_SCALE_POWER}] "
                f"(the scale starts at 2**initial_scale_power), got {initial_scale_power!r}"
            )
        if not _is_int(loss_scale_window) or loss_scale_window < 1:
            raise ValueError(f"precision.loss_scale_window must be an integer >= 1, got {loss_scale_window!r}")
        if not _is_int(hysteresis) or hysteresis < 1:
            raise ValueError(f"precision.hysteresis must be an integer >= 1, got {hysteresis!r}")
        initial_scale = 2.0 ** int(initial_scale_power)
        if not _is_real(min_loss_scale) or not _MIN_SCALE <= float(min_loss_scale) <= initial_scale:
            raise ValueError(
                f"precision.min_loss_scale must be a number in [2**-{MAX_SCALE_POWER}, 2**initial_scale_power = "
                f"{initial_scale:g}], got {min_loss_scale!r}"
            )
        if static_loss_scale is not None and (
            not _is_real(static_loss_scale) or not _MIN_SCALE <= float(static_loss_scale) <= _MAX_SCALE
        ):
            raise ValueError(
                f"precision.static_loss_scale must be null (dynamic scaling) or a number in "
                f"[2**-{MAX_SCALE_POWER}, 2**{MAX_SCALE_POWER}], got {static_loss_scale!r}"
            )
        if not isinstance(consecutive_hysteresis, bool):
            raise ValueError(f"precision.consecutive_hysteresis must be true or false, got {consecutive_hysteresis!r}")

        self.initial_scale_power = int(initial_scale_power)
        self.loss_scale_window = int(loss_scale_window)
        self.hysteresis = int(hysteresis)
        self.min_loss_scale = float(min_loss_scale)
        self.static_loss_scale = None if static_loss_scale is None else float(static_loss_scale)
        self.consecutive_hysteresis = consecutive_hysteresis

        self._scale = self.static_loss_scale if self.static_loss_scale is not None else initial_scale
        self._growth_tracker = 0
        self._cur_hysteresis = self.hysteresis
        self._skipped_steps = 0
        self._overflows = 0
        self._consecutive_overflows = 0
        self._loss_device: torch.device | None = None  # for the overflow flag when there are no gradients

    # ----- read-only state -------------------------------------------------------------------------
    @property
    def dynamic(self) -> bool:
        """False when ``static_loss_scale`` fixes the scale."""
        return self.static_loss_scale is None

    @property
    def scale(self) -> float:
        """The current loss scale."""
        return self._scale

    @property
    def loss_scale(self) -> float:
        """The current loss scale as a plain ``float``."""
        return self._scale

    @property
    def growth_tracker(self) -> int:
        """Consecutive clean steps since the last overflow or the last raise (dynamic mode; 0 when static)."""
        return self._growth_tracker

    @property
    def cur_hysteresis(self) -> int:
        """Overflows left before the next one halves the scale (in [1, hysteresis]; 1: the next one does)."""
        return self._cur_hysteresis

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because of an overflow, since the start of the run."""
        return self._skipped_steps

    @property
    def overflows(self) -> int:
        """Overflowing steps since the start of the run. Every overflowing step is skipped, so under the
        documented protocol this equals ``skipped_steps``; both names are kept for the logs."""
        return self._overflows

    @property
    def consecutive_overflows(self) -> int:
        """Overflowing steps since the last clean one (a run stuck at ``min_loss_scale`` keeps growing it)."""
        return self._consecutive_overflows

    # ----- the step protocol -----------------------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``, to call ``.backward()`` on. A tensor op: no host sync.

        fp16 / bf16 losses are upcast to float32 first so the scaled value itself cannot overflow."""
        if loss.dtype in (torch.float16, torch.bfloat16):
            loss = loss.float()
        self._loss_device = loss.device
        return loss * self._scale

    def unscale_(
        self,
        grads: Iterable[torch.Tensor | None],
        all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> bool:
        """Divide ``grads`` in place by the scale and say whether they are finite on every rank.

        Args:
            grads: the local gradient tensors (local shards; DTensors are unwrapped to their local
                tensor, ``None`` entries and empty tensors are skipped; mixed dtypes and devices are
                fine). An empty list is fine too: the rank still takes part in the all-reduce.
            all_reduce_max: takes a 1-element float32 tensor (this rank's flag: 1.0 = non-finite
                gradient seen, else 0.0) on the gradients' device and returns it MAX-reduced over all
                ranks (in place or as a new tensor; ``None`` returned counts as in place). ``None``:
                single process, the local flag decides.

        Returns:
            True when every gradient on every rank is finite (step), False otherwise (skip the step;
            the gradients are then garbage and should be zeroed). Reads one value to the host (the
            only sync). Call :meth:`update` with ``found_inf=not result`` afterwards.
        """
        inv_scale = 1.0 / self._scale
        local = []
        for grad in grads:
            if grad is None:
                continue
            if _DTensor is not None and isinstance(grad, _DTensor):
                with torch.no_grad():
                    grad = grad.to_local()
            local.append(grad)
        if local:
            device = local[0].device
        else:
            device = self._loss_device if self._loss_device is not None else torch.device("cpu")

        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for grad in local:
            if grad.numel() > 0:  # the inf-norm of an empty tensor is undefined (and there is nothing to do)
                groups.setdefault((grad.device, grad.dtype), []).append(grad)

        flags = []
        with torch.no_grad():
            for (group_device, dtype), group in groups.items():
                if inv_scale != 1.0:
                    if _exactly_representable(inv_scale, dtype):
                        factor: float | torch.Tensor = inv_scale
                    else:  # float32 math: a float32 scalar tensor is not rounded to the gradients' dtype
                        factor = torch.full((), inv_scale, dtype=torch.float32, device=group_device)
                    torch._foreach_mul_(group, factor)
                # max |g| per tensor: inf / nan exactly when an element is; cannot overflow on finite values.
                norms = torch._foreach_norm(group, math.inf)
                flags.append(torch.isfinite(torch.stack(norms)).all().logical_not().to(device))
            if flags:
                found = torch.stack(flags).any().to(torch.float32).reshape(1)
            else:
                found = torch.zeros(1, dtype=torch.float32, device=device)
            reduced = found if all_reduce_max is None else all_reduce_max(found)
            if reduced is None:
                reduced = found
            # A nan from a broken reduction compares unequal to 0: it counts as an overflow.
            return reduced.item() == 0.0

    def update(self, found_inf: bool) -> None:
        """Account for one optimizer step: ``found_inf`` True means it overflowed (and was skipped).

        Overflow: counted in ``skipped_steps`` / ``overflows``; dynamic mode: if the hysteresis budget
        is > 1 it is decremented and the scale kept, else the scale is halved (not below
        ``min_loss_scale``); either way the clean-step count restarts. Clean step: dynamic mode counts
        it (and refills the budget if ``consecutive_hysteresis``); the ``loss_scale_window``-th one
        doubles the scale (up to 2**126), refills the budget and restarts the count. Static mode only
        counts.
        """
        if found_inf:
            self._skipped_steps += 1
            self._overflows += 1
            self._consecutive_overflows += 1
            if self.dynamic:
                if self._cur_hysteresis > 1:
                    self._cur_hysteresis -= 1
                else:
                    self._scale = max(self._scale / SCALE_FACTOR, self.min_loss_scale)
                self._growth_tracker = 0
            return
        self._consecutive_overflows = 0
        if not self.dynamic:
            return
        if self.consecutive_hysteresis:
            self._cur_hysteresis = self.hysteresis
        self._growth_tracker += 1
        if self._growth_tracker >= self.loss_scale_window:
            self._scale = min(self._scale * SCALE_FACTOR, _MAX_SCALE)
            self._cur_hysteresis = self.hysteresis
            self._growth_tracker = 0

    # ----- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scaler's state as plain Python values (loads with ``torch.load(weights_only=True)``).

        The knobs are not stored: on resume the configuration of the new run applies."""
        return {
            "version": _STATE_VERSION,
            "dynamic": self.dynamic,
            "scale": float(self._scale),
            "growth_tracker": self._growth_tracker,
            "cur_hysteresis": self._cur_hysteresis,
            "skipped_steps": self._skipped_steps,
            "overflows": self._overflows,
            "consecutive_overflows": self._consecutive_overflows,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output, so that a resumed run continues identically.

        The counters are always restored. The dynamic state (scale, growth tracker, hysteresis
        budget) is restored when both the saved and this scaler are dynamic, then fitted to this
        run's knobs: the scale clamped to [min_loss_scale, 2**126], the budget to [1, hysteresis].
        A static scaler keeps its fixed scale; a dynamic one resumed from a static run starts from
        ``2**initial_scale_power``. Raises ``ValueError`` on a malformed state.
        """
        missing = [key for key in ("version", "dynamic", "scale", *_INT_STATE_KEYS) if key not in state]
        if missing:
            raise ValueError(f"loss scaler state lacks {', '.join(missing)}")
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"loss scaler state version {state['version']!r}; this code reads {_STATE_VERSION}")
        for key in _INT_STATE_KEYS:
            if not _is_int(state[key]) or state[key] < 0:
                raise ValueError(f"loss scaler state: {key} must be an integer >= 0, got {state[key]!r}")
        scale = state["scale"]
        if not _is_real(scale) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"loss scaler state: scale must be a finite number > 0, got {scale!r}")
        if not isinstance(state["dynamic"], bool):
            raise ValueError(f"loss scaler state: dynamic must be a bool, got {state['dynamic']!r}")

        self._skipped_steps = int(state["skipped_steps"])
        self._overflows = int(state["overflows"])
        self._consecutive_overflows = int(state["consecutive_overflows"])
        if self.dynamic and state["dynamic"]:
            self._scale = min(max(float(scale), self.min_loss_scale), _MAX_SCALE)
            self._growth_tracker = int(state["growth_tracker"])
            self._cur_hysteresis = min(max(int(state["cur_hysteresis"]), 1), self.hysteresis)

    def __repr__(self) -> str:
        if not self.dynamic:
            return f"DynamicLossScaler(static_loss_scale={self._scale:g}, skipped_steps={self._skipped_steps})"
        return (
            f"DynamicLossScaler(scale={self._scale:g}, growth_tracker={self._growth_tracker}/"
            f"{self.loss_scale_window}, cur_hysteresis={self._cur_hysteresis}/{self.hysteresis}, "
            f"skipped_steps={self._skipped_steps})"
        )
