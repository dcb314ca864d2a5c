"""The full (unsharded) state dict under ``strategy=pipeline``: every stage's tensors gathered on
rank 0 in the module's original order."""

from __future__ import annotations

import torch

from trainer.runtime import distributed


def gather_full_state_dict(local_names: dict[str, torch.Tensor], full_order: list[str],
                           contributes: bool) -> dict[str, torch.Tensor]:
    """``local_names``: this rank's tensors by full name; the merged dict on rank 0, ``{}`` elsewhere.
    A collective: sharded stages (replicas, tensor-parallel ranks) gather on every rank of the
    stage; one rank per stage ``contributes`` (the first replica's first tensor-parallel rank)."""
    from torch.distributed.tensor import DTensor

    mine = {n: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu() for n, t in local_names.items()}
    mine = mine if contributes else {}
    if not distributed.is_distributed():
        return mine
    pieces = distributed.all_gather_object(mine)
    if distributed.rank() != 0:
        return {}
    merged = {k: v for piece in pieces for k, v in piece.items()}
    return {n: merged[n] for n in full_order if n in merged}
