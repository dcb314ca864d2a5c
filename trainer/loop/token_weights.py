"""``loss_normalization=tokens``: a micro-batch's loss times its token count, without rounding the count.

The count is kept in float64 and multiplied in float32 at least (the loss is upcast; a float64
loss stays float64): a bfloat16 count is inexact above 256 and a float16 one is infinite above
65504. Only the dtype is looked at, on the host: no sync.

What upcasting cannot do: a loss *computed* in bfloat16 / float16 has a graph of that dtype, and
autograd hands it its incoming gradient (the count) in that dtype, rounded. So the weights reach the
gradient exactly only for a loss in float32 or wider (e.g. ``loss.float()`` at the end of
``training_step``, or a loss function that autocast runs in float32); for a narrower loss one
warning (rank 0) says so.
"""

from __future__ import annotations

import logging

import torch

from trainer.runtime import distributed

log = logging.getLogger(__name__)
_warned: set[torch.dtype] = set()


def token_weighted(loss: torch.Tensor, weight: torch.Tensor | float) -> torch.Tensor:
    """``loss * weight`` in ``promote_types(loss.dtype, float32)``; ``weight`` a tensor or a Python
    number (a Python count multiplies as a scalar: no tensor, no copy to the device)."""
    dtype = torch.promote_types(loss.dtype, torch.float32)
    if loss.dtype != dtype and loss.dtype not in _warned:
        _warned.add(loss.dtype)
        if distributed.rank() == 0:
            log.warning(
                "loss_normalization=tokens with a %s loss: its gradient carries the token counts rounded to %s "
                "(%s); return the loss in float32 (e.g. loss.float()) for exactly token-weighted gradients",
                str(loss.dtype).replace("torch.", ""), str(loss.dtype).replace("torch.", ""),
                "inexact above 256" if loss.dtype == torch.bfloat16 else "inexact above 2048, infinite above 65504",
            )
    if not isinstance(weight, torch.Tensor):
        return loss.to(dtype) * float(weight)  # rounded to ``dtype`` like ``weight.to(dtype)``
    return loss.to(dtype) * weight.to(dtype)
