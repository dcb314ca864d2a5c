"""The configured optimizer's state size, measured: bytes per element and per tensor.

Rather than a table per optimizer class, step the optimizer the user configured on tiny CPU
tensors (a few dozen elements) of the weights' dtype and count its state with
``trainer.runtime.memory.training_state_bytes``: with one tensor of ``k`` and one of ``2k`` elements,
the state grows by ``per_element x k`` between them and holds ``per_tensor`` twice. fp32 AdamW
gives 8 bytes per element (two moments) and 4 per tensor (its ``step`` counter); SGD with
momentum 4 and 0; plain SGD nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

_SMALL = 16


def _state_bytes(factory: Callable[..., torch.optim.Optimizer], numels: list[int], dtype: torch.dtype) -> int:
    from trainer.runtime.memory import training_state_bytes

    params = [nn.Parameter(torch.zeros(n, dtype=dtype)) for n in numels]
    optimizer = factory(params)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    holder = nn.ParameterList(params)
    return training_state_bytes(holder, optimizer)["optimizer"]


def optimizer_state_size(factory: Callable[..., Any], dtype: torch.dtype = torch.float32) -> tuple[float, int]:
    """``(bytes per element, bytes per tensor)`` of the optimizer ``factory(params)`` builds,
    after its first step, for parameters of ``dtype``."""
    one = _state_bytes(factory, [_SMALL], dtype)
    two = _state_bytes(factory, [_SMALL, 2 * _SMALL], dtype)
    # one = k e + t; two - one = the 2k tensor's state = 2k e + t; so (two - one) - one = k e.
    per_element = ((two - one) - one) / _SMALL
    per_tensor = one - per_element * _SMALL
    return per_element, int(round(per_tensor))
