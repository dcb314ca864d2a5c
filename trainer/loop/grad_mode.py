"""The autograd mode of validation, test and predict (``Trainer(inference_mode=)``).

``inference_mode=True`` (Lightning's default): ``torch.inference_mode()``, which also skips autograd's
version counting; False: ``torch.no_grad()``. Where the strategy's forward gathers sharded
parameters (FSDP, FSDP inside pipeline stages) or the strategy runs the forward itself (pipeline
stages exchanging activations), ``torch.no_grad()`` always: tensors the gathers create in inference
mode would be reused by training's forward, where inference tensors cannot be saved for backward
(Lightning also uses ``no_grad`` under FSDP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager

import torch

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun


def uses_inference_mode(run: RankRun) -> bool:
    """Whether this run's evaluation passes run under ``torch.inference_mode()``."""
    strategy = run.strategy
    return bool(run.trainer.inference_mode) and not (strategy.lockstep_forward or strategy.owns_step)


def evaluation_grad_mode(run: RankRun) -> ContextManager:
    """The context of an evaluation pass's forwards."""
    return torch.inference_mode() if uses_inference_mode(run) else torch.no_grad()
