"""Per-rank bytes of the training state under each strategy: the formulas, each derived beside its code.

Inputs are shapes only (``TensorShape``: the parameter's shape and whether it trains) and the
bytes an element / a tensor takes (``Bytes``); nothing here allocates. Every function returns one
``RankBytes`` per rank (or per pipeline stage), so uneven shares show.

Where the figures come from (all derived from how the code allocates, not copied from a table):

- Replicated (single, DDP, ZeRO-1's weights and gradients): every rank holds each parameter
  (``numel x param_bytes``) and, for a trainable one, its gradient (``numel x grad_bytes``).
- Optimizer state: ``numel x state_per_element + state_per_tensor`` for each trainable
  parameter, both *measured* by stepping the configured optimizer on two tiny tensors
  (``trainer/estimate/optimizer_state.py``): fp32 AdamW = 2 moments x 4 bytes per element + its
  4-byte ``step`` counter per tensor. The ZeRO paper's "2 + 2 + 12 bytes per parameter" is fp16
  weights + fp16 gradients + (fp32 master, momentum, variance); here mixed precision autocasts
  from the fp32 weights, which are the only copy: 4 + 4 + 8 (the bf16 casts live in the
  activations, counted there).
- DDP buckets: every gradient lives in exactly one all-reduce bucket (``bucket_cap_mb`` only
  decides how many buckets), so the buckets hold ``gradient bytes`` in total. With
  ``gradient_as_bucket_view=true`` (our default) the gradients *are* views into the buckets:
  0 extra bytes; with false, a second copy of the gradients.
- ZeRO-1 (``ZeroRedundancyOptimizer``): parameters sorted by numel (largest first, stable), each
  given whole to the rank with the smallest running total (lowest rank on ties), over the param
  groups in order with one running total: ``zero1_owners`` replays that assignment, so each
  rank's optimizer state is that of the parameters it owns (uneven).
- FSDP2 (``fully_shard``): each parameter is chunked on dim 0 over the ``N`` ranks of its
  sharding group (``torch.chunk``): chunk size ``c = ceil(rows / N)``; rank ``r`` holds
  ``max(0, min(c, rows - r c))`` rows, but its storage is always ``c`` rows (padded, so the
  all-gather is even). Parameters: padded storage. Gradients: views into the unit's padded
  reduce-scatter output: padded. Optimizer state: ``zeros_like`` of the unpadded local view:
  unpadded (rank ``r``'s own rows). Communication: FSDP2 gathers a unit into a padded unsharded
  buffer (``c N`` rows, in ``param_dtype``) and reduce-scatters from one of the same numel (in
  ``reduce_dtype``); under ``full`` the next unit is prefetched while one computes, so the all-gather
  buffers of the two largest units plus one reduce-scatter buffer; under ``grad_op``
  (``reshard_after_forward=False``) every unit stays gathered from its forward to its backward:
  all units' gather buffers plus one reduce-scatter buffer. ``no_shard``: N = 1. ``hybrid``: N = shard_size.
- CPU offload (FSDP ``cpu_offload``): sharded parameters, gradients and optimizer state live in
  host memory; the device holds the communication buffers and activations.
- Pipeline: a stage holds its layers' parameters, gradients and state (replicated over its
  data-parallel replicas under ``data_parallel=ddp``; sharded over them as FSDP ``full`` with a
  unit per pipeline layer under ``data_parallel=fsdp``). The stages are cut by
  ``trainer/strategies/pipeline_partition.partition_layers``, the same function the strategy uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Sequence


@dataclass(frozen=True)
class TensorShape:
    """A parameter's shape and whether it trains (gets a gradient and optimizer state)."""

    shape: tuple[int, ...]
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rows(self) -> int:
        """Size of dim 0 (what FSDP2 shards); 1 for a 0-dim tensor."""
        return self.shape[0] if self.shape else 1

    @property
    def row_numel(self) -> int:
        return self.numel // self.rows if self.rows else 0


@dataclass(frozen=True)
class Bytes:
    """Bytes per element / per tensor under a precision and optimizer."""

    param: int  # weights as held (fp32 = 4; bf16-true = 2; mixed precision keeps fp32 weights)
    grad: int  # gradients (the weights' dtype)
    state_per_element: float  # optimizer state per element of a trainable parameter
    state_per_tensor: int = 0  # optimizer state per trainable tensor (AdamW's step counter)
    gather: int = 4  # FSDP all-gather dtype (param_dtype; mixed precision: the compute dtype)
    reduce: int = 4  # FSDP reduce-scatter dtype (reduce_dtype)


@dataclass
class RankBytes:
    """One rank's (or pipeline stage's) device bytes."""

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    buckets: int = 0
    activations: int = 0

    @property
    def state(self) -> int:
        """Parameters + gradients + optimizer state (what ``training_state_bytes`` measures)."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


def _state(t: TensorShape, numel: int, b: Bytes) -> float:
    return numel * b.state_per_element + b.state_per_tensor if t.trainable else 0


def replicated(tensors: Sequence[TensorShape], b: Bytes) -> RankBytes:
    """Every rank holds every parameter, gradient and optimizer state (single device, DDP)."""
    return RankBytes(
        parameters=sum(t.numel * b.param for t in tensors),
        gradients=sum(t.numel * b.grad for t in tensors if t.trainable),
        optimizer=round(sum(_state(t, t.numel, b) for t in tensors)),
    )


def ddp_bucket_bytes(tensors: Sequence[TensorShape], b: Bytes, gradient_as_bucket_view: bool = True) -> int:
    """Bytes the all-reduce buckets add on top of the gradients (see the module docstring)."""
    return 0 if gradient_as_bucket_view else sum(t.numel * b.grad for t in tensors if t.trainable)


def ddp(tensors: Sequence[TensorShape], b: Bytes, world: int, gradient_as_bucket_view: bool = True) -> list[RankBytes]:
    ranks = []
    for _ in range(world):
        rank = replicated(tensors, b)
        rank.buckets = ddp_bucket_bytes(tensors, b, gradient_as_bucket_view)
        ranks.append(rank)
    return ranks


def zero1_owners(groups: Sequence[Sequence[TensorShape]], world: int) -> list[list[int]]:
    """For each param group, the owning rank of each of its parameters, as ZeroRedundancyOptimizer
    assigns them: largest first (a stable sort), to the rank with the smallest total so far."""
    totals = [0] * world
    owners = []
    for group in groups:
        owner = [0] * len(group)
        for index in sorted(range(len(group)), key=lambda i: group[i].numel, reverse=True):
            rank = totals.index(min(totals))
            owner[index] = rank
            totals[rank] += group[index].numel
        owners.append(owner)
    return owners


def zero1(groups: Sequence[Sequence[TensorShape]], b: Bytes, world: int,
          gradient_as_bucket_view: bool = True) -> list[RankBytes]:
    """DDP's weights, gradients and buckets on every rank; optimizer state of the owned parameters only."""
    tensors = [t for group in groups for t in group]
    owners = zero1_owners([[t for t in group if t.trainable] for group in groups], world)
    ranks = ddp(tensors, b, world, gradient_as_bucket_view)
    for rank, bytes_ in enumerate(ranks):
        bytes_.optimizer = round(sum(_state(t, t.numel, b)
                                     for group, owner in zip(groups, owners)
                                     for t, o in zip([t for t in group if t.trainable], owner) if o == rank))
    return ranks


def chunk_rows(rows: int, shards: int, rank: int) -> int:
    """Rows of a dim-0 chunk on ``rank`` (``torch.chunk``: size ceil(rows / shards), the last ones short or empty)."""
    size = -(-rows // shards)
    return max(0, min(size, rows - rank * size))


def padded_rows(rows: int, shards: int) -> int:
    """Rows of every rank's padded shard storage: ceil(rows / shards)."""
    return -(-rows // shards)


def fsdp(units: Sequence[Sequence[TensorShape]], b: Bytes, shards: int, mode: str = "full",
         offload: bool = False, unsharded_grads: bool = False) -> list[RankBytes]:
    """One ``RankBytes`` per rank of a sharding group of ``shards`` ranks (replicas across groups
    hold the same). ``units``: the parameters of each FSDP unit (the root's remaining ones too).
    ``mode``: full | grad_op (what the communication buffers hold; see the module docstring).
    ``unsharded_grads``: gradient accumulation without ``sync_every_microbatch``: the non-final
    micro-batches skip the reduce-scatter and keep every unit's unsharded gradients (in the
    compute dtype) until the last one: added to the buffers."""
    if mode not in ("full", "grad_op"):
        raise ValueError(f"mode={mode!r}: full or grad_op (no_shard is shards=1, hybrid is shards=shard_size)")
    gathered = [sum(padded_rows(t.rows, shards) * shards * t.row_numel for t in unit) for unit in units]
    trained = [sum(padded_rows(t.rows, shards) * shards * t.row_numel for t in unit if t.trainable) for unit in units]
    # full: a unit computing and the next one prefetched (the two largest); grad_op: all of them.
    held = sum(sorted(gathered)[-2:]) if mode == "full" else sum(gathered)
    if shards == 1:  # nothing to gather: the shard is the parameter; DDP-like gradient reduce in place
        held = 0
    comm = held * b.gather + max(trained, default=0) * b.reduce * (shards > 1)
    if unsharded_grads:
        comm += sum(trained) * b.gather
    tensors = [t for unit in units for t in unit]
    ranks = []
    for rank in range(shards):
        r = RankBytes(
            parameters=sum(padded_rows(t.rows, shards) * t.row_numel * b.param for t in tensors),
            gradients=sum(padded_rows(t.rows, shards) * t.row_numel * b.grad for t in tensors if t.trainable),
            optimizer=round(sum(_state(t, chunk_rows(t.rows, shards, rank) * t.row_numel, b) for t in tensors)),
            buckets=comm,
        )
        if offload:
            r.parameters = r.gradients = r.optimizer = 0
        ranks.append(r)
    return ranks


def pipeline_stages(layers: Sequence[Sequence[TensorShape]], bounds: Sequence[int], b: Bytes,
                    replicas: int = 1, data_parallel: str = "ddp",
                    gradient_as_bucket_view: bool = True) -> list[list[RankBytes]]:
    """Per stage (``bounds``: each stage's first layer, then the end), the bytes of each of its
    ``replicas`` ranks. ``data_parallel=fsdp``: each stage sharded over its replicas, one unit per layer."""
    stages = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        stage_layers = [list(layer) for layer in layers[start:end]]
        tensors = [t for layer in stage_layers for t in layer]
        if data_parallel == "fsdp" and replicas > 1:
            stages.append(fsdp(stage_layers, b, replicas, "full"))
        else:
            # One flat all-reduce of the stage's gradients over the replicas (pipeline_gradients.py).
            stage = replicated(tensors, b)
            stage.buckets = ddp_bucket_bytes(tensors, b, False) if replicas > 1 else 0
            stages.append([stage] * replicas)
    return stages
