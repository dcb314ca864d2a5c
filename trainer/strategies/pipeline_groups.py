"""The pipeline's mesh: ``world = stages x dp x tp`` on ParallelDims' device mesh (dims ``pp``,
``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; pp outermost, tp innermost), so
rank = (pp_index * dp + dp_index) * tp + tp_index; with tp = 1, rank = pp_index * dp + dp_index.

The replicas are ``dp_replicate`` under ``data_parallel=ddp`` (whole stages, gradients all-reduced)
and ``dp_shard`` under ``data_parallel=fsdp`` (stages sharded). The groups a rank uses:

- the pipeline group (``mesh["pp"]``): the stages of its pipeline at its own dp and tp coordinates,
  so each tensor-parallel rank sends its activations to the same tp coordinate of the next stage;
- the replica group (the flattened ``dp`` mesh): the replicas of its stage at its tp coordinate;
- the tensor-parallel mesh (``mesh["tp"]``): the ranks that split its stage's layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.strategies.parallel_dims import ParallelDims


@dataclass
class PipelineMesh:
    """This rank's view of the pipeline's mesh (see the module docstring)."""

    dims: ParallelDims
    mesh: Any  # the world's DeviceMesh
    dp_mesh: Any  # the flattened data-parallel mesh ("dp")
    pp_group: Any
    dp_group: Any

    @property
    def tp_mesh(self) -> Any:
        return self.mesh["tp"]


def pipeline_dims(pp: int, dp: int, tp: int, data_parallel: str) -> ParallelDims:
    """The degrees of a pipeline of ``pp`` stages, ``dp`` replicas (``data_parallel`` ddp: replicated,
    fsdp: sharded) and ``tp`` tensor-parallel ranks per stage."""
    replicate, shard = (dp, 1) if data_parallel == "ddp" else (1, dp)
    return ParallelDims(pp=pp, dp_replicate=replicate, dp_shard=shard, tp=tp)


def build_pipeline_mesh(dims: ParallelDims, device_type: str) -> PipelineMesh:
    """The mesh and this rank's groups. A collective: every rank builds every group, in the same order."""
    mesh, dp_mesh = dims.build_mesh(device_type)
    return PipelineMesh(dims, mesh, dp_mesh, mesh.get_group("pp"), dp_mesh.get_group())
