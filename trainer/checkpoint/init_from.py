"""``trainer.init_from``: a run's starting weights from a full state-dict file, read once on rank 0."""

from __future__ import annotations

import logging

import torch

from trainer import distributed
from trainer.checkpoint.manager import CheckpointError, load_file
from trainer.checkpoint.state import describe_mismatch, expected_shapes, set_training_state

log = logging.getLogger("trainer.checkpoint.manager")  # where this message was logged before the move


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
