"""Activation checkpointing and torch.compile, applied per block (the classes a TrainModule
declares in ``block_classes()``, the same units FSDP shards), before the strategy wraps the model:
the order torchtitan uses (checkpointing, then compile, then sharding)."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch
from torch import nn

log = logging.getLogger(__name__)


def _require_blocks(module: nn.Module, blocks: list[nn.Module], option: str) -> None:
    if not blocks:
        raise ValueError(
            f"{option}=true needs blocks to apply to, and {type(module).__name__} has none: return the block "
            "classes from TrainModule.block_classes() (e.g. the transformer block), or hold the blocks in an nn.ModuleList"
        )


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Non-reentrant: works with keyword arguments, inputs that need no grad, and FSDP2 / compile.
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(module: nn.Module, blocks: list[nn.Module]) -> None:
    """Recompute each block's activations in backward instead of keeping them: memory falls to
    about one block's activations, compute rises by one forward. Parameter names do not change
    (the block's ``forward`` is wrapped in place), so checkpoints are unaffected."""
    _require_blocks(module, blocks, "trainer.activation_checkpointing")
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward)  # type: ignore[method-assign]
    log.info("activation checkpointing on %d x %s", len(blocks), type(blocks[0]).__name__)


def compile_blocks(module: nn.Module, blocks: list[nn.Module]) -> None:
    """``torch.compile`` each block in place (``nn.Module.compile``): repeated blocks share one
    compiled graph, so compiling is faster than compiling the whole model, and the names of the
    parameters stay the same."""
    _require_blocks(module, blocks, "trainer.compile")
    for block in blocks:
        block.compile()
    log.info("torch.compile on %d x %s", len(blocks), type(blocks[0]).__name__)
