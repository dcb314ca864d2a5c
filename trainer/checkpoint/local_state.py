"""The full training state of a plain module on one process, without torch.distributed.checkpoint.

On one process with nothing sharded, wrapped or tied, ``torch.distributed.checkpoint.state_dict``
returns the module's own ``state_dict()`` and the optimizer's with each parameter id replaced by the
parameter's name. Importing that package costs more than the whole save of a small model (it
imports torch's elastic launcher and its rendezvous handlers), so a one-process run's checkpoint
builds the same two dicts here. Anything else (DTensors, a compiled or checkpoint-wrapped module,
tied parameters, an optimizer without state yet) returns None and goes through torch's helpers.
``tests/unit/checkpoint/test_local_state.py`` checks the two ways give the same dicts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Prefixes torch's helpers strip from names (torch.compile, activation checkpointing, FSDP1, DDP).
_WRAPPER_NAMES = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "module")


def _is_plain(module: nn.Module) -> bool:
    if isinstance(module, nn.parallel.DistributedDataParallel):
        return False
    for name, child in module.named_modules():
        if any(part in _WRAPPER_NAMES for part in name.split(".")) or type(child).__name__.startswith("FSDP"):
            return False
    # A tensor subclass (DTensor, a quantized or float8 tensor) is torch's helpers' to read.
    return all(type(t) in (torch.Tensor, nn.Parameter) for t in (*module.parameters(), *module.buffers()))


def plain_full_state(module: nn.Module, optimizer: Any) -> dict[str, Any] | None:
    """``{"model": ..., "optim": ...}`` as ``get_training_state(full=True)`` gives them on one
    process, or None where only torch's helpers know the answer (see the module docstring).
    ``optimizer``: one optimizer, None, or several (a list: torch's helpers read those)."""
    if not _is_plain(module):
        return None
    named = list(module.named_parameters(remove_duplicate=False))
    names = {id(param): name for name, param in named}
    if len(names) != len(named):  # a parameter under two names (tied weights)
        return None
    state: dict[str, Any] = {"model": module.state_dict()}
    if optimizer is None:
        return state
    if not isinstance(optimizer, torch.optim.Optimizer):  # several optimizers (manual optimization): torch's
        return None
    if not optimizer.state:  # torch's helpers first create the state with a step of zero gradients
        return None
    saved = optimizer.state_dict()
    ids = [param for group in optimizer.param_groups for param in group["params"]]
    if any(id(param) not in names for param in ids):
        return None
    # optimizer.state_dict() numbers the parameters in param_groups order.
    name_of = {index: names[id(param)] for index, param in enumerate(ids)}
    groups = [{**group, "params": [name_of[index] for index in group["params"]]} for group in saved["param_groups"]]
    state["optim"] = {"state": {name_of[index]: value for index, value in saved["state"].items()},
                      "param_groups": groups}
    return state
