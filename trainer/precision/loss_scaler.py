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
    found_inf = scaler.unscale_found_inf(grads, strategy.all_reduce_max)  # grads /= S; a device flag
    clip_grad_norm(...)                                # sync-free; garbage in, but the step is skipped
    sync_free_step(optimizer, found_inf)               # fused optimizers skip on the flag (fp16_step.py)
    scaler.update(found_inf)                           # adjusts S on the device; counts the skipped step
    optimizer.zero_grad()

(Optimizers that cannot take the flag read it instead: ``if scaler.unscale_(grads, ...)``, one host
read per step, and step only when it is True.)

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
scaled differently on later steps). So each rank computes a local 0/1 flag and the flags are
MAX-reduced over all ranks. The result stays on the device: the scaler's state is device tensors
(trainer/precision/scaler_state.py) and fused optimizers skip their update on it, so nothing is read
to the host unless asked (``scale``, ``skipped_steps``, ... on logging steps; checkpoints).

Exactness: with power-of-two scales, ``unscale_`` is exact (unless a value underflows the gradient
dtype itself). Unscaling multiplies by ``1/S`` held in a float32 scalar tensor (float64 for float64 gradients): float32
math, so the scalar is not rounded to the gradients' dtype first (PyTorch's CPU foreach kernels round a
Python scalar to fp16, and 2**-30 becomes 0). Where ``1/S`` is exactly representable in the gradients'
dtype this gives the same bits as that dtype's math (the exact product fits in float32). Overflow detection uses the
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
from typing import Any, Callable, Iterable

import torch

from trainer.precision.scaler_state import MAX_SCALE as _MAX_SCALE
from trainer.precision.scaler_state import SCALE_FACTOR, ScalerState
from trainer.runtime.value_checks import is_int

try:  # only to unwrap DTensor gradients; the trainer normally passes local shards already
    from torch.distributed.tensor import DTensor as _DTensor
except Exception:  # pragma: no cover - builds without torch.distributed
    _DTensor = None

__all__ = ["DynamicLossScaler", "SCALE_FACTOR", "MAX_SCALE_POWER"]

MAX_SCALE_POWER = 126
"""Scales live in [2**-126, 2**126]: both ``S`` and ``1/S`` are normal float32 numbers."""

_MIN_SCALE = 2.0**-MAX_SCALE_POWER
_STATE_VERSION = 1
_INT_STATE_KEYS = ("growth_tracker", "cur_hysteresis", "skipped_steps", "overflows", "consecutive_overflows")


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
        if not is_int(initial_scale_power) or not 0 <= initial_scale_power <= MAX_SCALE_POWER:
            raise ValueError(
                f"precision.initial_scale_power must be an integer in [0, {MAX_SCALE_POWER}] "
                f"(the scale starts at 2**initial_scale_power), got {initial_scale_power!r}"
            )
        if not is_int(loss_scale_window) or loss_scale_window < 1:
            raise ValueError(f"precision.loss_scale_window must be an integer >= 1, got {loss_scale_window!r}")
        if not is_int(hysteresis) or hysteresis < 1:
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

        scale = self.static_loss_scale if self.static_loss_scale is not None else initial_scale
        # Device tensors (moved to the loss's device at the first scale_loss): see scaler_state.py.
        self._state = ScalerState(scale, self.hysteresis, self.loss_scale_window, self.min_loss_scale,
                                  consecutive_hysteresis, dynamic=self.static_loss_scale is None)
        self._loss_device: torch.device | None = None  # for the overflow flag when there are no gradients

    # ----- read-only state (each read is a host read of a device value: logging steps, checkpoints) ------
    @property
    def dynamic(self) -> bool:
        """False when ``static_loss_scale`` fixes the scale."""
        return self.static_loss_scale is None

    @property
    def scale(self) -> float:
        """The current loss scale (read to the host)."""
        return float(self._state.scale)

    @property
    def loss_scale(self) -> float:
        """The current loss scale as a plain ``float`` (read to the host)."""
        return self.scale

    @property
    def growth_tracker(self) -> int:
        """Consecutive clean steps since the last overflow or the last raise (dynamic mode; 0 when static)."""
        return int(self._state.growth_tracker)

    @property
    def cur_hysteresis(self) -> int:
        """Overflows left before the next one halves the scale (in [1, hysteresis]; 1: the next one does)."""
        return int(self._state.cur_hysteresis)

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because of an overflow, since the start of the run."""
        return int(self._state.skipped_steps)

    @property
    def overflows(self) -> int:
        """Overflowing steps since the start of the run. Every overflowing step is skipped, so under the
        documented protocol this equals ``skipped_steps``; both names are kept for the logs."""
        return int(self._state.overflows)

    @property
    def consecutive_overflows(self) -> int:
        """Overflowing steps since the last clean one (a run stuck at ``min_loss_scale`` keeps growing it)."""
        return int(self._state.consecutive_overflows)

    # ----- the step protocol -----------------------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``, to call ``.backward()`` on. A tensor op: no host sync.

        fp16 / bf16 losses are upcast to float32 first so the scaled value itself cannot overflow."""
        if loss.dtype in (torch.float16, torch.bfloat16):
            loss = loss.float()
        self._loss_device = loss.device
        self._state.to(loss.device)
        # In the loss's dtype (what a Python-float scale gave): a 0-dim float64 would promote a 0-dim loss.
        return loss * self._state.scale.to(loss.dtype)

    def unscale_found_inf(
        self,
        grads: Iterable[torch.Tensor | None],
        all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Divide ``grads`` in place by the scale; return the overflow flag on the device (no host read).

        Args:
            grads: the local gradient tensors (local shards; DTensors are unwrapped to their local
                tensor, ``None`` entries and empty tensors are skipped; mixed dtypes and devices are
                fine). An empty list is fine too: the rank still takes part in the all-reduce.
            all_reduce_max: takes a 1-element float32 tensor (this rank's flag: 1.0 = non-finite
                gradient seen, else 0.0) on the gradients' device and returns it MAX-reduced over all
                ranks (in place or as a new tensor; ``None`` returned counts as in place). ``None``:
                single process, the local flag decides.

        Returns:
            A 0-dim float32 tensor: 1.0 when some gradient on some rank is not finite (skip the step),
            0.0 when all are (a NaN from a broken reduction counts as an overflow). Pass it to
            `update` and to ``trainer.precision.fp16_step.sync_free_step``.
        """
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
        self._state.to(self._loss_device or device)

        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for grad in local:
            if grad.numel() > 0:  # the inf-norm of an empty tensor is undefined (and there is nothing to do)
                groups.setdefault((grad.device, grad.dtype), []).append(grad)

        flags = []
        with torch.no_grad():
            inverse = self._state.scale.double().reciprocal()  # exact for powers of two
            factors: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
            for (group_device, dtype), group in groups.items():
                # float32 math (float64 for float64 gradients): a float32 scalar tensor is not rounded
                # to the gradients' dtype.
                factor_dtype = torch.float64 if dtype == torch.float64 else torch.float32
                key = (group_device, factor_dtype)
                if key not in factors:
                    factors[key] = inverse.to(device=group_device, dtype=factor_dtype)
                torch._foreach_mul_(group, factors[key])
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
            return (reduced.reshape(()) != 0).to(torch.float32)

    def unscale_(
        self,
        grads: Iterable[torch.Tensor | None],
        all_reduce_max: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> bool:
        """`unscale_found_inf`, read to the host: True when every gradient on every rank is finite
        (step), False otherwise (skip the step; the gradients are garbage and should be zeroed). One
        host read: for optimizers that cannot skip on a device flag. Call `update` afterwards."""
        return self.unscale_found_inf(grads, all_reduce_max).item() == 0.0

    def update(self, found_inf: bool | torch.Tensor) -> None:
        """Account for one optimizer step: ``found_inf`` true (a bool, or the tensor
        `unscale_found_inf` returned) means it overflowed (and was skipped). No host read.

        Overflow: counted in ``skipped_steps`` / ``overflows``; dynamic mode: if the hysteresis budget
        is > 1 it is decremented and the scale kept, else the scale is halved (not below
        ``min_loss_scale``); either way the clean-step count restarts. Clean step: dynamic mode counts
        it (and refills the budget if ``consecutive_hysteresis``); the ``loss_scale_window``-th one
        doubles the scale (up to 2**126), refills the budget and restarts the count. Static mode only
        counts.
        """
        if not isinstance(found_inf, torch.Tensor):
            found_inf = torch.tensor(bool(found_inf), device=self._state.device)
        self._state.update(found_inf)

    # ----- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The scaler's state as plain Python values (loads with ``torch.load(weights_only=True)``).

        The knobs are not stored: on resume the configuration of the new run applies. Reads the
        device state to the host."""
        state = self._state
        return {
            "version": _STATE_VERSION,
            "dynamic": self.dynamic,
            "scale": self.scale,
            **{key: int(getattr(state, key)) for key in _INT_STATE_KEYS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s output, so that a resumed run continues identically.

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
            if not is_int(state[key]) or state[key] < 0:
                raise ValueError(f"loss scaler state: {key} must be an integer >= 0, got {state[key]!r}")
        scale = state["scale"]
        if not _is_real(scale) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"loss scaler state: scale must be a finite number > 0, got {scale!r}")
        if not isinstance(state["dynamic"], bool):
            raise ValueError(f"loss scaler state: dynamic must be a bool, got {state['dynamic']!r}")

        self._state.set(skipped_steps=state["skipped_steps"], overflows=state["overflows"],
                        consecutive_overflows=state["consecutive_overflows"])
        if self.dynamic and state["dynamic"]:
            self._state.set(scale=min(max(float(scale), self.min_loss_scale), _MAX_SCALE),
                            growth_tracker=state["growth_tracker"],
                            cur_hysteresis=min(max(int(state["cur_hysteresis"]), 1), self.hysteresis))

    def __repr__(self) -> str:
        if not self.dynamic:
            return f"DynamicLossScaler(static_loss_scale={self.scale:g}, skipped_steps={self.skipped_steps})"
        return (
            f"DynamicLossScaler(scale={self.scale:g}, growth_tracker={self.growth_tracker}/"
            f"{self.loss_scale_window}, cur_hysteresis={self.cur_hysteresis}/{self.hysteresis}, "
            f"skipped_steps={self.skipped_steps})"
        )
