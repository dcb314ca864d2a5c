"""How strategy=nd's parallel degrees map onto strategy=pipeline's arguments: ``stages=pp``, ``tp``, and
the replicas' ``data_parallel`` (``ddp`` for ``dp_replicate``, ``fsdp`` for ``dp_shard``, ``hsdp`` for
both); `PipelineDegrees.from_degrees` takes the degrees as given, `PipelineDegrees.from_dims`
resolved ones. A base class of `PipelineStrategy`."""

from __future__ import annotations

from typing import Any, TypeVar

from trainer.strategies.parallel_dims import ParallelDims, check_degrees

_Pipeline = TypeVar("_Pipeline", bound="PipelineDegrees")


class PipelineDegrees:
    """strategy=nd's degrees -> the pipeline's arguments (PipelineStrategy's constructors)."""

    stages: int | None
    tp: int
    data_parallel: str
    dp_replicate: int | None
    _degrees: dict[str, int] | None

    @staticmethod
    def data_parallel_of(dp_replicate: int, dp_shard: int) -> dict[str, Any]:
        """The ``data_parallel`` (and ``dp_replicate``) arguments for a mesh's data-parallel degrees:
        whole stages per replica (ddp), sharded stages (fsdp), or both (hsdp)."""
        if dp_replicate > 1 and dp_shard > 1:
            return {"data_parallel": "hsdp", "dp_replicate": dp_replicate}
        return {"data_parallel": "fsdp" if dp_shard > 1 else "ddp"}

    @classmethod
    def from_dims(cls: type[_Pipeline], dims: Any, **options: Any) -> _Pipeline:
        """The pipeline for resolved degrees (a ``ParallelDims``: ``ParallelDims.resolve(world, pp=...,
        ...)``): ``stages=pp``, ``tp``, the replicas' ``data_parallel`` (`data_parallel_of`);
        ``options``: the other arguments (schedule, microbatches, meta_init, loss_parallel ...). The
        mesh it builds is ``dims``' own, rank for rank."""
        strategy = cls(**cls._other_options(options))
        strategy._apply_dims(dims)
        return strategy

    @classmethod
    def from_degrees(cls: type[_Pipeline], pp: int = 1, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1,
                     tp: int = 1, **options: Any) -> _Pipeline:
        """The pipeline for strategy=nd's degrees as given (one may be ``-1``, the rest of the world):
        resolved by ``ParallelDims.resolve`` when the world size is known (``check_world_size``, before
        any worker starts), then as `from_dims`. ``options``: the other arguments."""
        degrees = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
        check_degrees(degrees)
        if cp != 1:
            cls._refuse_cp(cp)
        strategy = cls(**cls._other_options(options))
        strategy._degrees = degrees
        return strategy

    @staticmethod
    def _other_options(options: dict[str, Any]) -> dict[str, Any]:
        given = sorted({"stages", "tp", "data_parallel", "dp_replicate"} & set(options))
        if given:
            raise ValueError(f"strategy.{given[0]} comes from the parallel degrees here (stages = pp, tp, the replicas "
                             "from dp_replicate / dp_shard); leave it out")
        return options

    @staticmethod
    def _refuse_cp(cp: int) -> None:
        raise ValueError(f"strategy.cp={cp}: context parallel is not supported with pipeline stages; set strategy.cp=1")

    def _apply_dims(self, dims: ParallelDims) -> None:
        if dims.cp != 1:
            self._refuse_cp(dims.cp)
        self.stages, self.tp = dims.pp, dims.tp
        options = self.data_parallel_of(dims.dp_replicate, dims.dp_shard)
        self.data_parallel, self.dp_replicate = options["data_parallel"], options.get("dp_replicate")
