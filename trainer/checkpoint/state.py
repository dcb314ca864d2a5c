"""Model and optimizer state in a layout-free form, and this rank's random number generators.

Keys are parameter names (``blocks.0.linear.weight``, optimizer state keyed by the same names),
never wrapper prefixes or parameter ids, so a checkpoint of one strategy loads into another:
DDP <-> FSDP, 2 ranks -> 1 or 4, strategy=nd's DTensors over a 2-D mesh (FSDP x tensor parallel)
-> another mesh or one process (DCP reshards them). Built on ``torch.distributed.checkpoint.state_dict``
(a plain module's full state on one process: ``local_state.py``, the same dicts without importing it).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from trainer.checkpoint.local_state import plain_full_state
from trainer.runtime import distributed
from trainer.optim.param_groups import keep_param_group_dicts
from trainer.strategies.base import OptimizerStateIO


def _options(full: bool, **extra: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Full state: gathered one tensor at a time into rank 0's CPU memory (cpu_offload also means
    # "rank 0 only"), so no rank ever holds several copies.
    return StateDictOptions(full_state_dict=full, cpu_offload=full and distributed.is_distributed(), **extra)


def get_training_state(
    module: nn.Module, optimizer: torch.optim.Optimizer | None, full: bool, strategy: OptimizerStateIO | None = None
) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}``: sharded (DTensors stay DTensors) or full on rank 0 (other
    ranks get empty dicts). A collective under FSDP: call on every rank. ``strategy``: one whose
    optimizer keeps its state elsewhere (ZeRO-1) gives the optimizer entry itself."""
    own = None
    if strategy is not None and optimizer is not None:
        own = strategy.optimizer_state_dict(module, optimizer, full)
    if full and own is None and not distributed.is_distributed():
        local = plain_full_state(module, optimizer)
        if local is not None:
            return local
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None or own is not None:
        state = {"model": get_model_state_dict(module, options=_options(full))}
        return state if own is None else {**state, "optim": own}
    model_state, optim_state = get_state_dict(module, optimizer, options=_options(full))
    return {"model": model_state, "optim": optim_state}


def set_training_state(
    module: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any], full: bool,
    strategy: OptimizerStateIO | None = None,
) -> None:
    """Load ``state`` (as from `get_training_state`). With ``full``, only rank 0's ``state``
    is read; it is broadcast / scattered into every rank's shards."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = _options(full, broadcast_from_rank0=full and distributed.is_distributed())
    # Two calls, not set_state_dict: that one treats the empty model dict the other ranks pass
    # with broadcast_from_rank0 as "optimizer only", and rank 0 would wait for them forever.
    if optimizer is not None and not (
        strategy is not None and strategy.load_optimizer_state_dict(module, optimizer, state["optim"], full)
    ):
        # One process: the full state is the local one (and torch's full-state path cannot load an
        # optimizer without tensor state, e.g. plain SGD).
        optim_options = options if distributed.is_distributed() else _options(False)
        with keep_param_group_dicts(optimizer):
            set_optimizer_state_dict(module, optimizer, state["optim"], options=optim_options)
    set_model_state_dict(module, state["model"], options=options)


def expected_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global shape of every model tensor, by name (DTensor shapes are global already)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {k: tuple(v.shape) for k, v in get_model_state_dict(module).items() if isinstance(v, torch.Tensor)}


def describe_mismatch(expected: dict[str, tuple], found: dict[str, tuple]) -> str | None:
    """None if the names and shapes agree, else a short account of what differs."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [f"{k}: checkpoint {tuple(found[k])} vs model {tuple(expected[k])}"
              for k in sorted(set(expected) & set(found)) if tuple(found[k]) != tuple(expected[k])]
    if not (missing or unexpected or shapes):
        return None

    def clip(items: list[str]) -> str:
        return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")

    parts = []
    if missing:
        parts.append(f"missing keys: {clip(missing)}")
    if unexpected:
        parts.append(f"unexpected keys: {clip(unexpected)}")
    if shapes:
        parts.append(f"shape mismatch: {clip(shapes)}")
    return "; ".join(parts)


def mesh_layout(module: nn.Module) -> dict[str, int] | None:
    """``{dimension name: size}`` of the device mesh ``module`` is spread over (``device_mesh``:
    strategy=nd), None without one. A checkpoint records it: the ranks' random generators map onto
    another run's only when its layout is the same, not merely its number of ranks."""
    mesh = getattr(module, "device_mesh", None)
    if mesh is None:
        return None
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    return {name: int(size) for name, size in zip(names, mesh.shape)}


def describe_layout(world_size: int, mesh: dict[str, int] | None) -> str:
    """``4 ranks (dp_shard 2 x tp 2)`` for the log; the size-1 dimensions left out."""
    spread = " x ".join(f"{name} {size}" for name, size in (mesh or {}).items() if size > 1)
    return f"{world_size} rank{'s' if world_size != 1 else ''}" + (f" ({spread})" if spread else "")


# ----- random number generators ---------------------------------------------------------------------------
def get_rng_state() -> dict[str, Any]:
    """Every generator the training draws from, in a form ``torch.load(weights_only=True)`` reads."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached)
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
