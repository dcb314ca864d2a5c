"""One file of full model weights from any checkpoint, for inference or export."""

from __future__ import annotations

import os
import warnings

import torch

from trainer.checkpoint import integrity, layout


def consolidate(path: str, out: str) -> dict[str, torch.Tensor]:
    """Write the model weights of checkpoint ``path`` (a checkpoint directory, or a directory of
    checkpoints: the latest) to ``out`` as a plain ``{name: tensor}`` state dict, the same names a
    single-process ``module.state_dict()`` has. Works without a process group or a model."""
    weights = full_weights(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.save(weights, out)
    return weights


def full_weights(path: str) -> dict[str, torch.Tensor]:
    """The full model weights (``{name: tensor}``, on the CPU) of checkpoint ``path`` (as for
    `consolidate`), read in this process without a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from trainer.checkpoint.loading import CheckpointError, load_file

    checkpoint = layout.resolve(path, path)
    if checkpoint is None:
        raise CheckpointError(f"{path}: no complete checkpoint")
    integrity.verify(checkpoint)  # a damaged file is named, not met deep inside DCP
    if layout.read_marker(checkpoint)["format"] == "full":
        weights = load_file(os.path.join(checkpoint, "model_optim.pt"))["model"]
    else:
        folder = os.path.join(checkpoint, "model_optim")
        metadata = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
        # Allocate the full tensors the metadata describes, then let DCP fill them from the shards.
        state = {
            key: torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in metadata.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
        with warnings.catch_warnings():  # DCP's note that it reads without a process group: intended here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
            dcp.load(state, checkpoint_id=folder, no_dist=True)
        weights = {key[len("model."):]: tensor for key, tensor in state.items()}
    return weights
