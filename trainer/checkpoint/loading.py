"""Reading checkpoints into a model: the weights-only file reader, the model / optimizer state of a
checkpoint directory (``load_training_state``) and ``trainer.init_from``'s weights (``load_weights``).

``CheckpointManager`` (``manager.py``) uses these for a resume; ``load_from_checkpoint`` and
``consolidate`` read files with ``load_file``. Each ``load_*`` here is a collective.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from trainer.runtime import distributed
from trainer.runtime.launch import RankAgreedError
from trainer.checkpoint.state import describe_mismatch, expected_shapes, get_training_state, set_training_state
from trainer.strategies.base import OptimizerStateIO

log = logging.getLogger("trainer.checkpoint.manager")  # the logger name these messages always had

class CheckpointError(RankAgreedError):
    """A checkpoint cannot be read or does not fit the model; the message names the file."""


def load_file(path: str) -> Any:
    """``torch.load`` with ``weights_only=True`` (no code runs from the file), with errors that
    name the file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # zip / unpickling errors come in many types
        raise CheckpointError(f"{path}: cannot be read ({type(error).__name__}: {error}); the file is truncated, "
                              "corrupt, or not a weights-only torch file") from None


def load_training_state(
    path: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, fmt: str, part_of_model: bool = False,
    strategy: OptimizerStateIO | None = None,
) -> None:
    """Load model (and optimizer) state of a checkpoint directory into the current layout, with a
    clear error if the checkpoint belongs to another model. A collective. ``part_of_model``: this
    rank holds only some of the model's layers (pipeline stages), so other names are expected.
    ``strategy``: the run's, for optimizers that keep their state elsewhere (ZeRO-1)."""
    import torch.distributed.checkpoint as dcp

    if part_of_model and fmt == "full":
        raise CheckpointError(f"{path}: a full-format checkpoint cannot be loaded into pipeline stages yet; "
                              "save with checkpoint.format=sharded, or consolidate it and use trainer.init_from")

    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
    expected = expected_shapes(module)
    if fmt == "full":
        file = os.path.join(path, "model_optim.pt")
        state, problem = {"model": {}, "optim": {}}, None
        if distributed.rank() == 0:  # read once, on rank 0; the others receive their shards
            try:
                state = load_file(file)
                problem = describe_mismatch(expected, {k: tuple(v.shape) for k, v in state["model"].items()})
            except CheckpointError as error:
                problem = str(error)
        problem = distributed.broadcast_object(problem)
        if problem:
            raise CheckpointError(problem if problem.startswith(file) else f"{file} does not fit the model: {problem}")
        if optimizer is None:
            state.pop("optim", None)
        set_training_state(module, optimizer, state, full=True, strategy=strategy)
        return
    folder = os.path.join(path, "model_optim")
    try:
        metadata = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    except Exception as error:
        raise CheckpointError(f"{folder}: cannot read the checkpoint metadata ({type(error).__name__}: {error})") from None
    found = {k[len("model."):]: tuple(v.size) for k, v in metadata.items() if k.startswith("model.") and hasattr(v, "chunks")}
    if part_of_model:  # the other stages' layers are in the checkpoint too
        found = {name: shape for name, shape in found.items() if name in expected}
    problem = describe_mismatch(expected, found)
    if problem:
        raise CheckpointError(f"{folder} does not fit the model: {problem}")
    state = get_training_state(module, optimizer, full=False, strategy=strategy)
    try:
        dcp.load(state, checkpoint_id=folder, no_dist=not distributed.is_distributed())
    except Exception as error:
        raise CheckpointError(f"{folder}: cannot be loaded ({type(error).__name__}: {error})") from None
    set_training_state(module, optimizer, state, full=False, strategy=strategy)


def renamed_by_the_models_hooks(module: torch.nn.Module, weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` (a copy) after the load-state-dict pre-hooks the model's own classes registered
    (e.g. the gpt recipe's split of an older fused ``qkv``), as ``module.load_state_dict`` would
    run them; here before the names are checked and scattered, which do not go through
    ``load_state_dict``. torch's own hooks (FSDP's) act on the live module and are left out. A hook
    must leave names already in the current layout alone (it runs again if ``load_state_dict`` does)."""
    weights = dict(weights)
    for name, submodule in module.named_modules():
        for hook in submodule._load_state_dict_pre_hooks.values():
            if not getattr(hook, "__module__", "torch.").startswith("torch."):
                hook(weights, f"{name}." if name else "", {}, True, [], [], [])
    return weights


def load_weights(file: str, module: torch.nn.Module, part_of_model: bool = False) -> None:
    """``trainer.init_from``: start from the full state dict in ``file`` (``{name: tensor}``, or a
    dict with a "model" entry). Read once, on rank 0, and broadcast / scattered into each rank's
    shards: never read by every rank, never a full copy per rank under FSDP. A collective.
    ``part_of_model``: this rank holds only some layers (pipeline stages); it takes its own names
    from the file (each must be there) and skips the others'."""
    expected = expected_shapes(module)
    weights, found, problem = {}, {}, None
    if distributed.rank() == 0:
        try:
            loaded = load_file(file)
            weights = loaded["model"] if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict) else loaded
            weights = renamed_by_the_models_hooks(module, weights)
            found = {k: tuple(v.shape) for k, v in weights.items()}
        except CheckpointError as error:
            problem = str(error)
    if part_of_model:  # every stage checks its own names against the file's (names and shapes only)
        found, problem = distributed.broadcast_object((found, problem))
        if problem is None:
            mine = describe_mismatch(expected, {k: v for k, v in found.items() if k in expected})
            problem = next((f"{file} does not fit the model: {p} (on rank {r})"
                            for r, p in enumerate(distributed.all_gather_object(mine)) if p), None)
    else:
        if problem is None and distributed.rank() == 0:
            problem = describe_mismatch(expected, found)
            problem = problem and f"{file} does not fit the model: {problem}"
        problem = distributed.broadcast_object(problem)
    if problem:
        raise CheckpointError(f"trainer.init_from: {problem}")
    if part_of_model and distributed.is_distributed():
        # Stages hold different names (torch's broadcast_from_rank0 wants the same everywhere):
        # rank 0 sends the file's tensors one at a time, each rank keeps its own stages' tensors.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        mine = {}
        for name in found:
            tensor = distributed.broadcast_object(weights[name] if distributed.rank() == 0 else None)
            if name in expected:
                mine[name] = tensor
        set_model_state_dict(module, mine, options=StateDictOptions(full_state_dict=True))
    else:
        set_training_state(module, None, {"model": weights}, full=True)
    log.info("initialised the weights from %s", file)
