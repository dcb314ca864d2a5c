"""Whether calling a module gathers FSDP-sharded parameters from other ranks.

A forward of a module whose parameters FSDP has sharded over several ranks all-gathers them first:
every rank that holds a shard must make the same call. Code that runs on one rank only (Lightning's
``@rank_zero_only``) and calls such a module would wait for ranks that never join, until the
collective timeout; `gathering_ranks` lets that code refuse the call at once instead.
"""

from __future__ import annotations

from torch import nn

from trainer.strategies.fsdp import ROOT_KEY


def gathering_ranks(module: nn.Module) -> int:
    """How many ranks a forward of ``module`` gathers its parameters from: 1 when it gathers nothing
    (unsharded, already gathered, or sharded over a group of one rank, as ``sharding: no_shard``).

    A module gathers when it is an FSDP unit, when it is the module an FSDP run wrapped (its forward
    gathers the root's parameters, trainer/strategies/fsdp.py), or when it holds sharded parameters
    itself (a layer whose parameters belong to the root)."""
    from torch.distributed.fsdp import FSDPModule

    whole = isinstance(module, FSDPModule) or ROOT_KEY in module.__dict__
    return max((_shard_ranks(p) for p in module.parameters(recurse=whole)), default=1)


def _shard_ranks(parameter: nn.Parameter) -> int:
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(parameter, DTensor):  # (FSDP swaps in plain tensors while a unit is gathered)
        return 1
    mesh = parameter.device_mesh
    sizes = [mesh.size(dim) for dim, placement in enumerate(parameter.placements) if isinstance(placement, Shard)]
    ranks = 1
    for size in sizes:
        ranks *= size
    return ranks
