"""The pipeline's 2-D mesh: ``world = stages x dp``, ranks laid out (pp, dp):
rank = pp_index * dp + dp_index. One process group per pipeline (its stages) and one per stage
(its data-parallel replicas)."""

from __future__ import annotations

from typing import Any

import torch


def pipeline_and_replica_groups(pp_size: int, data_parallel_size: int, pp_rank: int, dp_rank: int) -> tuple[Any, Any]:
    """``(pp_group, dp_group)`` of this rank: the ranks of its pipeline and the replicas of its stage.
    A collective (``new_group``): every rank creates every group, in the same order."""
    pp_group = dp_group = None
    for d in range(data_parallel_size):
        group = torch.distributed.new_group([p * data_parallel_size + d for p in range(pp_size)])
        if d == dp_rank:
            pp_group = group
    for p in range(pp_size):
        group = torch.distributed.new_group([p * data_parallel_size + d for d in range(data_parallel_size)])
        if p == pp_rank:
            dp_group = group
    return pp_group, dp_group
