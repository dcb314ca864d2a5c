"""Pipeline parallel on ``torch.distributed.pipelining``, optionally x data parallel (2-D mesh).

The module lists its layers in order (``TrainModule.pipeline_layers``); the layers are cut into
``stages x virtual_stages`` contiguous pieces; pipeline rank ``p`` runs pieces ``p, p + stages, ...``
(one piece unless interleaved). The strategy owns the forward and backward of a step
(``owns_step``): the schedule splits each rank's batch into ``microbatches``, the loss
(``TrainModule.pipeline_loss``) is computed on the last stage, scaled so that the gradients are
those of the global-batch mean, and reported to every rank through the metric reduction.

Mesh: ``world = stages x dp x tp`` (ParallelDims' mesh, pipeline_groups.py), ranks laid out
(pp, dp, tp): rank = (pp_index * dp + dp_index) * tp + tp_index. With ``tp > 1`` each stage's
layers are split over its tensor-parallel ranks by the module's plan
(``TrainModule.tensor_parallel_plan``; pipeline_tp.py), which see the same batch; the loss runs
under ``loss_parallel()`` when the last stage's output is vocabulary-sharded. With
dp > 1 and ``data_parallel=ddp`` each replica holds its stages whole and their gradients are
averaged over the dp group once per optimizer step (one flat all-reduce, no overlap with the
backward); with ``data_parallel=fsdp`` each stage is sharded over its dp group (FSDP2, a unit per
pipeline layer), the schedule reduce-scatters the gradients after its last backward.

Build (``meta_init``, the default): ``configure_model`` runs on the meta device; each rank then
walks the model in order, allocating and initialising one submodule at a time, seeded as one
process's build, and keeps only its own stages' tensors (the others go back to the meta device at
once). The weights equal one process's, and no rank ever holds more than its stages plus one
layer. This replays ``reset_parameters()`` (or ``TrainModule.init_weights``), as FSDP's meta
build does (trainer/strategies/weight_init.py); ``meta_init=false`` builds the whole model eagerly instead.
Either way the other stages' tensors are then deleted from the module, so its parameters, state
dict and checkpoints are this rank's stages only.

Files: this one holds the strategy's arguments, set-up and build; ``pipeline_schedule_step.py`` its
step (loss scaling, the microbatch records, metrics, gradient norms), ``pipeline_degrees.py``
strategy=nd's degrees mapped onto its arguments; the loop's trainer/loop/pipeline_micro_batches.py
feeds it each micro-batch (``run_step``), ``pipeline_groups.py`` the mesh and its process groups,
``pipeline_tp.py`` tensor parallelism, ``pipeline_partition.py`` the stage cutting,
``pipeline_build.py`` the build and module surgery (and ``SCHEDULES``), ``pipeline_batches.py``
slicing and padding, ``pipeline_gradients.py`` the data-parallel all-reduce and the norms,
``pipeline_state.py`` the full state dict's gathering.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import ContextManager, Sequence

import torch
from torch import nn

from trainer.runtime import distributed
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.value_checks import is_int
from trainer.strategies.base import OwnedStep
from trainer.strategies.parallel_dims import ParallelDims
from trainer.strategies.pipeline_build import SCHEDULES, build_stages
from trainer.strategies.pipeline_degrees import PipelineDegrees
from trainer.strategies.pipeline_groups import build_pipeline_mesh, pipeline_dims
from trainer.strategies.pipeline_partition import PARTITIONS
from trainer.strategies.pipeline_state import gather_full_state_dict
from trainer.strategies.pipeline_schedule_step import PipelineScheduleStep
from trainer.strategies.weight_init import WeightInit

DATA_PARALLEL = ("ddp", "fsdp", "hsdp")


class PipelineStrategy(PipelineDegrees, PipelineScheduleStep, OwnedStep):
    """Cut the model into stages over ranks; optionally replicate the pipeline (data parallel).

    Args:
        stages: pipeline ranks (None = the world size / ``tp``, no data parallelism); ``stages x tp``
            must divide the world size; the rest is the data-parallel degree.
        schedule: "gpipe" | "1f1b" | "interleaved_1f1b" | "looped_bfs" | "zero_bubble" (interleaved
            zero bubble; the last three run ``virtual_stages`` stages per rank).
        microbatches: pieces each rank's batch is split into (None = the number of pipeline stages);
            must divide ``data.batch_size``; >= stages for 1F1B.
        partition: "parameters" (balanced parameter counts), "uniform" (layer counts), or a list of
            the first layer index of each stage after the first (over all virtual stages).
        virtual_stages: stages per rank (None = 2 for the interleaved schedules, else 1).
        meta_init: build the model on the meta device and materialise only this rank's stages
            (see the module docstring); False builds the whole model on every rank first.
        data_parallel: with replicas (world > stages), "ddp" keeps each stage whole on every
            replica and all-reduces its gradients once per optimizer step; "fsdp" shards each
            stage over its replicas (FSDP2, every pipeline layer a unit; ZeRO-3 inside the stage);
            "hsdp" shards each stage over groups of replicas and replicates it across
            ``dp_replicate`` such groups (FSDP2's hybrid sharding on a 2-D replica mesh).
        dp_replicate: with ``data_parallel=hsdp``, how many copies of each shard group (it must
            divide the replicas; the rest shard); null otherwise.
        tp: tensor-parallel ranks per stage (1: none): each stage's layers are split over ``tp``
            ranks by the module's ``tensor_parallel_plan()`` (entries of other stages' layers are
            skipped); those ranks load the same samples.
        loss_parallel: with ``tp > 1``, run the schedule under torch's ``loss_parallel()``, so that a
            plan whose last layer returns vocabulary-sharded logits (a DTensor) gets its
            cross-entropy computed without gathering them.

    Under ``strategy=nd`` with ``pp > 1`` the degrees map to ``stages=pp``, ``tp=tp`` and
    (`data_parallel_of`) ``data_parallel="fsdp"`` for ``dp_shard`` replicas, ``"ddp"`` for
    ``dp_replicate`` ones, ``"hsdp"`` with ``dp_replicate=dp_replicate`` for both; the mesh is then
    ParallelDims(pp, dp_replicate, dp_shard, 1, tp)'s, rank for rank. `from_degrees` takes the
    degrees as given (``-1`` included), `from_dims` resolved ones.
    """

    name = "pipeline"
    supports_multiple_devices = True
    #: stages hold different layers and the full format gathers on rank 0 only through DTensors:
    #: each stage writes its own layers (sharded), consolidated afterwards into one file.
    checkpoint_formats = ("sharded",)
    #: torch's pipeline stages need a process group, also for several virtual stages in one process
    needs_process_group = True
    group_holders = ("pp_group", "dp_group", "dp_mesh", "tp_mesh", "hsdp_mesh", "mesh", "pipeline_stages", "schedule")
    #: Each batch norm lives on one stage and runs once per schedule microbatch: synchronising it
    #: over the world would wait for stages that never call it (a hang). Refused before any worker.
    sync_batchnorm_refusal = ("each batch norm lives on one pipeline stage, so the statistics cannot be synchronised "
                              "over the world; set trainer.sync_batchnorm=false (batch norms then normalise each "
                              "pipeline microbatch), or train with strategy=ddp or strategy=fsdp to synchronise them")

    def __init__(self, accelerator: str = "auto", stages: int | None = None, schedule: str = "1f1b",
                 microbatches: int | None = None, partition: str | Sequence[int] = "parameters",
                 virtual_stages: int | None = None, meta_init: bool = True, data_parallel: str = "ddp",
                 tp: int = 1, loss_parallel: bool = True, dp_replicate: int | None = None):
        super().__init__(accelerator)
        if schedule not in SCHEDULES:
            raise ValueError(f"strategy.schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
        multi = SCHEDULES[schedule][1]
        virtual_stages = virtual_stages if virtual_stages is not None else (2 if multi else 1)
        if not isinstance(virtual_stages, int) or virtual_stages < 1 or (not multi and virtual_stages != 1):
            raise ValueError(f"strategy.virtual_stages={virtual_stages!r}: schedule {schedule} takes "
                             + ("an integer >= 1" if multi else "1 stage per rank (use interleaved_1f1b for more)"))
        if stages is not None and (not isinstance(stages, int) or stages < 1):
            raise ValueError(f"strategy.stages={stages!r} must be null or an integer >= 1")
        if not is_int(tp) or tp < 1:
            raise ValueError(f"strategy.tp={tp!r} must be an integer >= 1 (tensor-parallel ranks per stage)")
        if not isinstance(loss_parallel, bool):
            raise ValueError(f"strategy.loss_parallel={loss_parallel!r} must be true or false")
        if microbatches is not None and (not isinstance(microbatches, int) or microbatches < 1):
            raise ValueError(f"strategy.microbatches={microbatches!r} must be null or an integer >= 1")
        if isinstance(partition, str) and partition not in PARTITIONS:
            raise ValueError(f"strategy.partition={partition!r} is not one of {PARTITIONS} or a list of split indices")
        self.stages, self.schedule_name, self.virtual_stages = stages, schedule, virtual_stages
        self.microbatches = microbatches
        self.meta_init = meta_init
        if data_parallel not in DATA_PARALLEL:
            raise ValueError(f"strategy.data_parallel={data_parallel!r} is not one of {', '.join(DATA_PARALLEL)}")
        self.data_parallel = data_parallel
        if data_parallel == "hsdp" and (isinstance(dp_replicate, bool) or not isinstance(dp_replicate, int)
                                        or dp_replicate < 1):
            raise ValueError(f"strategy.dp_replicate={dp_replicate!r}: data_parallel=hsdp needs the number of copies "
                             "of each shard group, an integer >= 1")
        if data_parallel != "hsdp" and dp_replicate is not None:
            raise ValueError(f"strategy.dp_replicate={dp_replicate!r} is for data_parallel=hsdp; with "
                             f"data_parallel={data_parallel} leave it null")
        self.dp_replicate = dp_replicate
        self.tp, self.loss_parallel = tp, loss_parallel
        self.mesh = self.dp_mesh = self.tp_mesh = self.hsdp_mesh = None
        self.partition = partition if isinstance(partition, str) else list(partition)
        self.pp_size, self._data_parallel_size, self.pp_rank, self.dp_rank, self.tp_rank = 1, 1, 0, 0, 0
        self.pp_group = self.dp_group = None
        self._degrees: dict[str, int] | None = None  # (from_degrees)
        self._metric_names: list[str] | None = None
        self._counts_tokens: bool | None = None
        self._by_tokens = False

    # ----- set-up --------------------------------------------------------------------------------------
    def _pp(self, world_size: int) -> int:
        return self.stages if self.stages is not None else max(1, world_size // self.tp)

    def check_world_size(self, world_size: int, devices_per_node: int) -> None:
        if self._degrees is not None:  # (from_degrees) the degrees, resolved for this world
            self._apply_dims(ParallelDims.resolve(world_size, **self._degrees))
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        if self.tp > 1 and world_size % self.tp:
            raise ValueError(f"strategy.tp={self.tp} does not divide the world size {world_size}; "
                             f"choose one of {divisors}")
        if self.tp > 1 and world_size % (self._pp(world_size) * self.tp):
            raise ValueError(f"strategy.stages={self._pp(world_size)} x strategy.tp={self.tp} = "
                             f"{self._pp(world_size) * self.tp} does not divide the world size {world_size}; choose "
                             f"stages x tp among {divisors}")
        if world_size % self._pp(world_size):
            raise ValueError(f"strategy.stages={self._pp(world_size)} does not divide the world size {world_size}; "
                             f"choose one of {divisors}")
        replicas = self.data_parallel_size(world_size)
        if self.data_parallel == "hsdp" and replicas % self.dp_replicate:
            raise ValueError(f"strategy.dp_replicate={self.dp_replicate} does not divide the {replicas} replicas "
                             f"(world {world_size} / stages {self._pp(world_size)} / tp {self.tp}); choose one of "
                             f"{[d for d in range(1, replicas + 1) if replicas % d == 0]}")
        n = self.microbatches if self.microbatches is not None else self._pp(world_size)
        if self.schedule_name != "gpipe" and n < self._pp(world_size):
            raise ValueError(f"strategy.microbatches={n} must be >= strategy.stages={self._pp(world_size)} "
                             f"for schedule {self.schedule_name}")

    def check_batch_size(self, batch_size: int, world_size: int) -> None:
        stages = self._pp(world_size)
        n = self.microbatches if self.microbatches is not None else stages
        if batch_size % n:
            smallest = 1 if self.schedule_name == "gpipe" else stages  # the other schedules need one per stage
            divisors = [d for d in range(smallest, batch_size + 1) if batch_size % d == 0]
            given = f"strategy.microbatches={n}" if self.microbatches is not None else \
                f"strategy.microbatches=null (the {stages} stages)"
            fixes = ([f"strategy.microbatches to one of {divisors}"] if divisors else []) + \
                [f"data.batch_size to a multiple of {n}"]
            raise ValueError(f"{given} does not divide data.batch_size={batch_size}; set {', or '.join(fixes)}")

    def data_parallel_size(self, world_size: int | None = None) -> int:
        """The pipelines (replicas of the whole model): ``world_size`` / (stages x tp); ``None``: this
        run's (set by ``setup_environment``; 1 before)."""
        return self._data_parallel_size if world_size is None else world_size // (self._pp(world_size) * self.tp)

    def setup_environment(self, env: ClusterEnvironment, timeout: timedelta) -> None:
        super().setup_environment(env, timeout)  # alone: a group of one (needs_process_group)
        world = distributed.world_size()
        self.check_world_size(world, env.local_world_size)
        self.pp_size = self._pp(world)
        self._data_parallel_size = world // (self.pp_size * self.tp)
        dims = pipeline_dims(self.pp_size, self._data_parallel_size, self.tp, self.data_parallel, self.dp_replicate)
        coordinates = dims.coordinates(distributed.rank())
        self.pp_rank, self.tp_rank = coordinates["pp"], coordinates["tp"]
        self.dp_rank = dims.data_parallel_rank(distributed.rank())
        if self.microbatches is None:
            self.microbatches = self.pp_size
        if world > 1:
            mesh = build_pipeline_mesh(dims, self.device.type)
            self.mesh, self.dp_mesh, self.tp_mesh = mesh.mesh, mesh.dp_mesh, mesh.tp_mesh
            self.pp_group, self.dp_group = mesh.pp_group, mesh.dp_group
            if self.data_parallel == "hsdp":
                self.hsdp_mesh = mesh.mesh["dp_replicate", "dp_shard"]

    @property
    def shards_stages(self) -> bool:
        """FSDP inside each stage (``data_parallel=fsdp`` with more than one replica)."""
        return self.data_parallel in ("fsdp", "hsdp") and self._data_parallel_size > 1

    @property
    def lockstep_forward(self) -> bool:  # type: ignore[override]
        # FSDP's gathers are collectives over the replicas: they run the same number of forwards.
        return self.shards_stages

    def init_context(self) -> ContextManager:
        return torch.device("meta") if self.meta_init else contextlib.nullcontext()

    @property
    def data_parallel_rank(self) -> int:
        return self.dp_rank

    @property
    def random_stream_rank(self) -> int:
        """One random stream per tensor-parallel group (tp is the mesh's innermost dimension): its
        first rank's, so the tp ranks of a stage draw the same dropout masks on replicated activations."""
        return distributed.rank() - self.tp_rank

    def check_module(self, module: nn.Module) -> None:
        """Before any worker starts, with ``tp > 1``: the module can be split over ``tp`` ranks
        (``check_tensor_parallel``), declares a plan, and each plan entry names a submodule inside
        one pipeline layer (checked on a meta-device copy of the model, as strategy=nd checks its
        plan; a model whose ``configure_model`` cannot run there is checked by each rank instead).
        Always: the module's own ``check_pipeline`` (a model that cannot be cut into stages)."""
        check_pipeline = getattr(module, "check_pipeline", None)
        if callable(check_pipeline):
            check_pipeline()
        if self.tp == 1:
            return
        from trainer.strategies.nd_probe import probe_copy
        from trainer.strategies.pipeline_tp import stage_plans
        from trainer.strategies.tensor_parallel import module_plan

        check = getattr(module, "check_tensor_parallel", None)
        if callable(check):
            check(self.tp)
        if module_plan(module) is None:
            stage_plans(module, self.tp, [], [], [])  # raises: no plan
        try:
            probe = probe_copy(module)
            with torch.device("meta"):  # the layers it builds hold no memory
                probe.configure_model()
            layers = probe.pipeline_layers() if hasattr(probe, "pipeline_layers") else None
        except Exception:  # noqa: BLE001 - the ranks check the plan on the real build
            return
        if layers:  # (none: refused when the stages are built, with its own message)
            stage_plans(probe, self.tp, layers, [], [])

    def before_configure_model(self, module: nn.Module) -> None:
        """The module's ``device_mesh``: the pipeline's (dims pp, dp_replicate, dp_shard, cp, tp)."""
        if self.mesh is not None:
            module.__dict__["_device_mesh"] = self.mesh

    # ----- building the stages ---------------------------------------------------------------------------
    def wrap(self, module: nn.Module, init: WeightInit | None = None) -> nn.Module:
        """This rank's stages of ``module`` (pipeline_build.py); returns the first local stage."""
        return build_stages(self, module, init)

    def _shard_unit(self, unit: nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        # hsdp: the 2-D replica mesh (replicate, shard); fsdp: the replicas' 1-D mesh
        fully_shard(unit, mesh=self.hsdp_mesh if self.data_parallel == "hsdp" else self.dp_mesh)

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        return gather_full_state_dict(self.local_names, self._full_order, self.dp_rank == 0 and self.tp_rank == 0)
