"""The batch settings of a run: what the user gave (``BatchArguments``) and what they resolve to
(``BatchSettings``).

The Trainer resolves them once at construction from its own arguments (``data.batch_size`` and the
rest); a run resolves them again against the module's ``train_dataloader()`` (a loader's
``batch_size`` is adopted when ``data.batch_size`` is unset) and, under ``trainer.auto_batch_size``,
against the finder's choice. Each resolution is a new frozen ``BatchSettings``: the run holds its
own, the Trainer is never written during a run, and ``trainer.batch_size`` and its siblings read the
live run's settings (then the last run's, then the configured ones).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainer.runtime.value_checks import is_int, require


@dataclass(frozen=True)
class BatchArguments:
    """The data settings as the user gave them (None: not given)."""

    batch_size: int | None = None
    drop_last: bool | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    global_batch_size: int | None = None
    accumulate_grad_batches: int = 1


@dataclass(frozen=True)
class BatchSettings:
    """The resolved batch of a run: the per-rank micro-batch, accumulation, the global batch they
    make on ``data_parallel_size`` ranks, and the training loader's settings."""

    batch_size: int
    drop_last: bool
    accumulate_grad_batches: int
    global_batch_size: int
    data_parallel_size: int
    num_workers: int = 0
    pin_memory: bool = False

    def with_micro_batch(self, batch_size: int, accumulate_grad_batches: int) -> BatchSettings:
        """The same settings with another split of the global batch (the batch-size finder's choice)."""
        return replace(self, batch_size=batch_size, accumulate_grad_batches=accumulate_grad_batches,
                       global_batch_size=batch_size * accumulate_grad_batches * self.data_parallel_size)


def resolve_batch(arguments: BatchArguments, batch_size: int, drop_last: bool, data_parallel_size: int,
                  world_size: int, num_workers: int = 0, pin_memory: bool = False,
                  final: bool = True) -> BatchSettings:
    """The settings for a micro-batch of ``batch_size`` per rank: the accumulation follows from
    ``data.global_batch_size`` when it is given (``final=False``: not checked yet, the micro-batch is
    a default until a run reads the module's loader)."""
    accumulate = arguments.accumulate_grad_batches
    wanted = arguments.global_batch_size
    if wanted is not None and final:
        per_micro_step = batch_size * data_parallel_size
        derived, rest = divmod(wanted, per_micro_step)
        require(
            is_int(wanted) and rest == 0 and derived >= 1,
            f"data.global_batch_size={wanted} is not a multiple of data.batch_size {batch_size} x "
            f"world size {world_size} = {per_micro_step}; use a multiple of {per_micro_step}",
        )
        require(
            accumulate in (1, derived),
            f"data.global_batch_size={wanted} needs trainer.accumulate_grad_batches={derived} "
            f"(batch_size {batch_size} x world size {world_size} x {derived}), but it is {accumulate}",
        )
        accumulate = derived
    return BatchSettings(batch_size=batch_size, drop_last=drop_last, accumulate_grad_batches=accumulate,
                         global_batch_size=batch_size * accumulate * data_parallel_size,
                         data_parallel_size=data_parallel_size, num_workers=num_workers, pin_memory=pin_memory)
