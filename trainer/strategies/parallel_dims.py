"""The degrees of an N-D parallel layout, checked in one place, and the device mesh they make.

Five degrees multiply to the world size (torchtitan's ParallelDims, Accelerate's ParallelismConfig):

==============  =====================================================================================
pp              pipeline stages (layers cut into stages; one micro-batch schedule per data replica)
dp_replicate    data-parallel replicas holding whole copies of their part of the model (DDP, HSDP's outer dim)
dp_shard        data-parallel ranks sharding parameters, gradients and optimizer state (FSDP, HSDP's inner dim)
cp              context parallel (the sequence split over ranks in attention): CUDA only, refused here
tp              tensor parallel (each layer's weights split over ranks; with sequence parallel for norms)
==============  =====================================================================================

One degree may be ``-1``: "the rest of the world". The mesh's dimensions are laid out outermost
first, ``(pp, dp_replicate, dp_shard, cp, tp)``: tensor-parallel ranks are neighbours (the fastest
links, inside a node), pipeline stages furthest apart. The data-parallel ranks (``dp_replicate x
dp_shard``) each load different samples; the ranks of one tensor-parallel group load the same ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: mesh dimension names, outermost first
DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_degrees(degrees: dict[str, Any]) -> None:
    """Each degree a positive integer or -1 (the rest of the world): one line naming the first that is not.
    (Their product is checked against the world size by `ParallelDims.resolve`, once it is known.)"""
    for name, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
            raise ValueError(f"strategy.{name}={value!r} must be a positive integer, or -1 for the rest of the world")


@dataclass(frozen=True)
class ParallelDims:
    """Concrete degrees (no ``-1``) whose product is the world size: build with `resolve`."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @classmethod
    def resolve(cls, world_size: int, **degrees: Any) -> ParallelDims:
        """Check the degrees against ``world_size`` and fill in the one given as ``-1``.

        Raises ValueError with one line naming the bad degree and what is allowed: a degree that is
        not a positive integer or -1, more than one -1, a product that is not the world size."""
        unknown = sorted(set(degrees) - set(DIM_NAMES))
        if unknown:
            raise ValueError(f"strategy.{unknown[0]} is not a parallel degree; the degrees are {', '.join(DIM_NAMES)}")
        values = {name: degrees.get(name, 1) for name in DIM_NAMES}
        check_degrees(values)
        rest = [name for name, value in values.items() if value == -1]
        if len(rest) > 1:
            raise ValueError(f"strategy.{rest[0]} and strategy.{rest[1]} are both -1; at most one degree may be -1 (the rest)")
        known = math.prod(value for value in values.values() if value != -1)
        written = " x ".join(f"{name} {values[name]}" for name in DIM_NAMES if values[name] != 1)
        if rest:
            if world_size % known:
                raise ValueError(
                    f"the parallel degrees ({written}) do not divide the world size {world_size}: the degrees other "
                    f"than strategy.{rest[0]}=-1 multiply to {known}; choose degrees that multiply to a divisor of "
                    f"{world_size} ({_divisors(world_size)})")
            values[rest[0]] = world_size // known
        elif known != world_size:
            raise ValueError(
                f"the parallel degrees ({written or 'all 1'}) multiply to {known}, not to the world size {world_size} "
                f"(trainer.devices x trainer.num_nodes); set one degree to -1 for the rest, or change trainer.devices")
        return cls(**values)

    # ----- derived sizes ----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: replicas x shards (each loads different samples)."""
        return self.dp_replicate * self.dp_shard

    def sizes(self) -> tuple[int, ...]:
        """The mesh shape, in `DIM_NAMES` order."""
        return tuple(getattr(self, name) for name in DIM_NAMES)

    def describe(self) -> str:
        """One line for the log: ``pp 2 x dp_shard 2 x tp 2 = 8 ranks``."""
        parts = [f"{name} {getattr(self, name)}" for name in DIM_NAMES if getattr(self, name) > 1]
        return f"{' x '.join(parts) or 'one rank'} = {self.world_size} rank{'s' if self.world_size > 1 else ''}"

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where global ``rank`` sits on each dimension (row-major over `sizes`)."""
        coords = {}
        for name, size in reversed(list(zip(DIM_NAMES, self.sizes()))):
            coords[name] = rank % size
            rank //= size
        return {name: coords[name] for name in DIM_NAMES}

    def data_parallel_rank(self, rank: int) -> int:
        """Which samples global ``rank`` loads: its index among the data-parallel ranks."""
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def tp_group_first_rank(self, rank: int) -> int:
        """The global rank at tensor-parallel coordinate 0 of ``rank``'s tensor-parallel group (tp is
        the fastest dimension: the group is ``tp`` neighbouring ranks)."""
        return rank - self.coordinates(rank)["tp"]

    # ----- the mesh --------------------------------------------------------------------------------------
    def build_mesh(self, device_type: str) -> tuple[Any, Any]:
        """``(mesh, dp_mesh)``: the world's DeviceMesh with every dimension named (size-1 ones included,
        so ``mesh["tp"]`` always exists), and the flattened data-parallel mesh (``dp_replicate x
        dp_shard``, named ``"dp"``), the group the data plan and the metric means use. Keep ``dp_mesh``:
        slicing ``mesh["dp"]`` again is deprecated by torch. A collective."""
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device_type, self.sizes(), mesh_dim_names=DIM_NAMES)
        dp_mesh = mesh["dp_replicate", "dp_shard"]._flatten("dp")  # a private torch API, as torchtitan uses it
        return mesh, dp_mesh
