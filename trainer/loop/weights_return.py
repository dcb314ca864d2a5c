"""The trained weights back in the caller's module when the work ran in spawned workers.

In-process runs (one process, or a rank under torchrun) train the caller's module itself. Spawned
workers train copies: rank 0's result file (trainer/loop/run_result.py) holds the full weights, which
the launcher copies into the caller's module. ``trainer.return_weights=false`` skips the weights
(models too big for one process's memory): the module then keeps its initial weights and is marked,
so that validating it without a checkpoint is an error instead of silently measuring untrained weights.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

#: set on a module whose spawned fit did not copy its weights back: the run directory
STALE_MARK = "_trainer_weights_left_in"


def deliver_weights(module: nn.Module, state_dict: dict[str, torch.Tensor] | None, run_dir: str) -> None:
    """In the launcher after a spawned fit: the trained full weights into the caller's ``module``; without
    them (``return_weights=false``) the module is marked, so that evaluating it needs a checkpoint."""
    if state_dict is None:
        setattr(module, STALE_MARK, run_dir)
        return
    load_full_weights(module, state_dict)
    if hasattr(module, STALE_MARK):
        delattr(module, STALE_MARK)


def load_full_weights(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a full state dict (parameter and buffer names) into ``module``'s own tensors. A module
    that builds its layers in ``configure_model`` gets it called first, here in the caller."""
    own = _named_tensors(module)
    if any(name not in own for name in state):
        module.configure_model()
        own = _named_tensors(module)
    unexpected = sorted(name for name in state if name not in own)
    covered = {id(own[name]) for name in state if name in own}  # tied tensors: one name is enough
    skip = _non_persistent_buffers(module)
    missing = sorted(name for name, tensor in own.items() if id(tensor) not in covered and name not in skip)
    if unexpected or missing:
        raise RuntimeError(
            f"the trained weights do not fit {type(module).__name__} in the calling process "
            f"(missing: {missing[:5]}, unexpected: {unexpected[:5]}); does configure_model() build every layer?"
        )
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    tensors: dict[str, Any] = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    return tensors


def _non_persistent_buffers(module: nn.Module) -> set[str]:
    return {f"{prefix}.{name}" if prefix else name
            for prefix, sub in module.named_modules(remove_duplicate=False)
            for name in getattr(sub, "_non_persistent_buffers_set", ())}


def refuse_stale_module(module: nn.Module, mode: str) -> None:
    """``validate`` without a checkpoint of a module whose trained weights stayed in the workers."""
    run_dir = getattr(module, STALE_MARK, None)
    if run_dir is not None:
        raise ValueError(
            f"Trainer.{mode}: this module was fitted with trainer.return_weights=false, so it still holds its "
            f"initial weights (the trained ones are in the checkpoints of {run_dir}); pass ckpt_path=\"last\" "
            "(or a checkpoint path) to evaluate the trained model"
        )
