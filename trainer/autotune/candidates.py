"""The candidates: strategy x micro-batch x activation checkpointing, all training the same global batch.

The global batch (``micro-batch x accumulation x data-parallel ranks``) stays the configured one in
every candidate: a smaller micro-batch runs more accumulation micro-steps, so every row trains the
same samples per optimizer step and the throughputs compare the same training. A micro-batch size
that cannot keep it (the global batch per rank is not a multiple of it) is refused with the sizes that can.

Tensor parallel: for a module that declares a ``tensor_parallel_plan()``, ``strategy=nd`` candidates
``nd_tp<T>`` (TP over T ranks, FSDP over the rest: ``strategy.dp_shard=-1``) for each degree T that
divides the world and passes the module's ``check_tensor_parallel`` (``nd`` in ``autotune.strategies``;
the degrees: ``autotune.tp_degrees``). Their
T ranks of one replica share its samples, so each data-parallel rank takes T times the samples and
accumulates T times as many micro-batches of the same size: the global batch stays the same.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from trainer.autotune.settings import AutotuneError

#: ``autotune.strategies`` names -> the overrides that select them (conf/strategy/*.yaml).
STRATEGIES: dict[str, tuple[str, ...]] = {
    "ddp": ("strategy=ddp",),
    "ddp_zero1": ("strategy=ddp", "strategy.zero1=true"),
    "fsdp_grad_op": ("strategy=fsdp", "strategy.sharding=grad_op"),
    "fsdp_full": ("strategy=fsdp", "strategy.sharding=full"),
    "fsdp_no_shard": ("strategy=fsdp", "strategy.sharding=no_shard"),
}


#: ``autotune.strategies`` entry for the tensor-parallel candidates, and the prefix of their names (nd_tp2, ...)
TENSOR_PARALLEL = "nd"
TP_PREFIX = "nd_tp"


@dataclass(frozen=True)
class GlobalBatch:
    """The configured global batch and the world it is split over."""

    size: int
    world: int
    micro: int  # the configured micro-batch (data.batch_size)

    @property
    def per_rank(self) -> int:
        return self.size // self.world

    def accumulation(self, micro: int, tp: int = 1) -> int:
        """Micro-steps per optimizer step with this micro-batch (it must divide ``per_rank``); with
        ``tp`` tensor-parallel ranks per replica, each data-parallel rank takes ``tp`` ranks' share."""
        return self.per_rank * tp // micro

    def fits(self, micro: int) -> bool:
        return micro >= 1 and self.per_rank % micro == 0

    def allowed(self) -> list[int]:
        """The micro-batch sizes that keep this global batch."""
        return [m for m in range(1, self.per_rank + 1) if self.per_rank % m == 0]

    def describe(self) -> str:
        return f"{self.size} samples per optimizer step (micro-batch x accumulation x {self.world} ranks)"


@dataclass(frozen=True)
class Candidate:
    """One configuration to try."""

    strategy: str  # a key of STRATEGIES, or nd_tp<T> (tensor parallel over T ranks, FSDP over the rest)
    micro_batch_size: int
    accumulation: int
    activation_checkpointing: bool

    @property
    def tp(self) -> int:
        """The tensor-parallel degree (1 for the STRATEGIES)."""
        return _tp_of(self.strategy)

    @property
    def label(self) -> str:
        return (f"{self.strategy} micro {self.micro_batch_size} x accum {self.accumulation}"
                f"{' ckpt' if self.activation_checkpointing else ''}")

    def overrides(self) -> list[str]:
        """The ``train.py`` overrides that select this candidate."""
        chosen = STRATEGIES.get(self.strategy) or ("strategy=nd", f"strategy.tp={self.tp}", "strategy.dp_shard=-1")
        return [*chosen, f"data.batch_size={self.micro_batch_size}",
                f"trainer.accumulate_grad_batches={self.accumulation}",
                f"trainer.activation_checkpointing={str(self.activation_checkpointing).lower()}"]


def global_batch(config: Any) -> GlobalBatch:
    """The configured global batch: ``data.global_batch_size`` if set, else ``data.batch_size x
    trainer.accumulate_grad_batches x devices``. The trials run on this machine: ``num_nodes`` 1."""
    data, trainer = config.data, config.trainer
    micro = data.batch_size
    if micro is None:
        raise AutotuneError("data.batch_size is unset (null) in this config: set data.batch_size=N, the micro-batch "
                            "that, with trainer.accumulate_grad_batches and trainer.devices, sets the global batch "
                            "every candidate keeps")
    if trainer.num_nodes != 1:
        raise AutotuneError(f"trainer.num_nodes={trainer.num_nodes}: the autotuner runs its trials on this machine; "
                            f"tune with trainer.num_nodes=1 and trainer.devices=<processes per node>")
    devices = trainer.devices
    if not (isinstance(devices, int) and devices >= 1):
        raise AutotuneError(f"trainer.devices must be an integer >= 1 for the autotuner, got {devices!r}")
    if data.get("global_batch_size") is not None:
        size = data.global_batch_size
        if size % (micro * devices):
            raise AutotuneError(f"data.global_batch_size={size} is not a multiple of data.batch_size {micro} x "
                                f"trainer.devices {devices}")
    else:
        size = micro * trainer.accumulate_grad_batches * devices
    return GlobalBatch(size=size, world=devices, micro=micro)


def micro_batch_sizes(requested: list[int] | None, batch: GlobalBatch) -> list[int]:
    """The sizes to try, ascending. ``None``: half, the configured size and double, those that keep
    the global batch (double needs the configured accumulation to be even)."""
    if requested is None:
        defaults = [batch.micro // 2] if batch.micro % 2 == 0 else []
        return [m for m in defaults + [batch.micro, batch.micro * 2] if batch.fits(m)]
    for micro in requested:
        if not batch.fits(micro):
            raise AutotuneError(
                f"autotune.micro_batch_sizes: {micro} cannot keep the global batch of {batch.size} on {batch.world} "
                f"ranks ({batch.per_rank} per rank is not a multiple of it); allowed: {batch.allowed()}"
            )
    return sorted(requested)


def model_has_blocks(module_config: Any) -> bool:
    """Whether activation checkpointing has blocks to apply to in this module (the units
    ``trainer.activation_checkpointing`` uses). The module is built on the meta device: no memory."""
    import torch
    from hydra.utils import instantiate

    from trainer.strategies.wrap_policy import select_units

    with torch.device("meta"):
        module = instantiate(module_config)
        module.configure_model()
    return bool(select_units(module, "auto", module.block_classes()))


def checkpointing_options(requested: list[bool] | None, typed: bool | None, has_blocks: Any) -> list[bool]:
    """The activation checkpointing settings to try.

    Args:
        requested: ``autotune.activation_checkpointing`` (None: decide here).
        typed: the user's own ``trainer.activation_checkpointing=...`` if given (then only that, when
            ``requested`` is None), else None.
        has_blocks: a callable returning whether the model has blocks (called only when needed).
    """
    if requested is None:
        if typed is not None:
            return [typed]
        return [False, True] if has_blocks() else [False]
    if True in requested and not has_blocks():
        raise AutotuneError("autotune.activation_checkpointing includes true, but the model has no blocks to "
                            "checkpoint (declare TrainModule.block_classes() or hold the blocks in an nn.ModuleList); "
                            "allowed here: [false]")
    return list(requested)


def tensor_parallel_degrees(requested: list[int] | None, module_config: Any, world: int) -> list[int]:
    """The TP degrees to try (``autotune.tp_degrees``): None = every degree > 1 dividing ``world``
    that the module accepts, when it declares a plan (none otherwise); a list is checked (each must
    divide the world and pass ``check_tensor_parallel``; the module must declare a plan). The module
    is built on the meta device: no memory."""
    import torch
    from hydra.utils import instantiate

    from trainer.strategies.tensor_parallel import expand_plan, module_plan

    if requested is not None and not requested:
        return []
    with torch.device("meta"):
        module = instantiate(module_config)
        module.configure_model()
    plan = module_plan(module)
    if plan is None:
        if requested is None:
            return []
        raise AutotuneError(f"autotune.tp_degrees={requested}: {type(module).__name__} declares no "
                            "tensor_parallel_plan(); declare one or set autotune.tp_degrees=[]")
    try:
        expand_plan(module, plan)
    except ValueError as error:
        raise AutotuneError(str(error)) from None

    def refusal(tp: int) -> str | None:
        if world % tp:
            return f"{tp} does not divide trainer.devices={world}"
        try:
            module.check_tensor_parallel(tp)
        except ValueError as error:
            return str(error)
        return None

    if requested is None:
        return [tp for tp in range(2, world + 1) if refusal(tp) is None]
    for tp in requested:
        reason = refusal(tp)
        if reason is not None:
            allowed = [t for t in range(2, world + 1) if refusal(t) is None]
            raise AutotuneError(f"autotune.tp_degrees: {reason}; allowed here: {allowed}")
    return list(requested)


def generate(strategies: list[str], micro_sizes: list[int], checkpointing: list[bool], batch: GlobalBatch,
             tp_degrees: list[int] = ()) -> list[Candidate]:
    """Every combination. Micro-batch outermost, the configured one first: a budget that ends the
    search early has then compared every strategy at the configured size. The tensor-parallel
    candidates (``nd_tp<T>``) follow the strategies at each micro-batch size."""
    ordered = sorted(micro_sizes, key=lambda m: (m != batch.micro, m))
    names = [*(s for s in strategies if s != TENSOR_PARALLEL), *(f"{TP_PREFIX}{tp}" for tp in tp_degrees)]
    return [Candidate(name, micro, batch.accumulation(micro, _tp_of(name)), ckpt)
            for micro, name, ckpt in itertools.product(ordered, names, checkpointing)]


def _tp_of(name: str) -> int:
    return int(name[len(TP_PREFIX):]) if name.startswith(TP_PREFIX) else 1
