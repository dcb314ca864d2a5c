"""What to checkpoint, when, and how many to keep (the ``checkpoint`` config group)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

FORMATS = ("sharded", "full")


@dataclass
class CheckpointConfig:
    """When and how checkpoints are saved (``checkpoint.*`` on the command line, ``checkpoint=`` in Python).

    Args:
        dir: where checkpoints go; None = ``<run_dir>/checkpoints``.
        every_n_steps: save every this many optimizer steps (``global_step``; under manual
            optimization after the batch that reaches or crosses a multiple) (None = off).
        every_n_epochs: save at the end of every this many epochs (None = off).
        save_last: save when training ends.
        format: "sharded" (torch.distributed.checkpoint: every rank writes its shards, loadable on
            any world size and strategy) or "full" (rank 0 writes one consolidated file).
        async_save: write in the background while training goes on (at most one save in flight).
        keep_last: keep this many newest checkpoints (None = all).
        monitor: a logged metric by which the ``keep_best`` best checkpoints are also kept (None: off).
        mode: "min" (the lowest ``monitor`` is best) or "max".
        keep_best: how many of the best checkpoints by ``monitor`` are kept.
        save_on_signal: on SIGTERM / SIGUSR1 (preemption), save and stop cleanly (exit code 0).
        signal_check_every_n_steps: with several processes, how often the ranks agree on a
            preemption signal (a small CPU all-reduce). None (default): on logging steps only
            (every ``trainer.log_every_n_steps`` and the last step), so the other steps make no
            collective; a signal then stops and saves within ``log_every_n_steps`` steps. A number
            N also agrees every N steps (bound: the smaller of the two). One process: every step
            (no collective).
    """

    dir: str | None = None
    every_n_steps: int | None = None
    every_n_epochs: int | None = None
    save_last: bool = True
    format: str = "sharded"
    async_save: bool = False
    keep_last: int | None = 3
    monitor: str | None = None
    mode: str = "min"
    keep_best: int = 1
    save_on_signal: bool = True
    signal_check_every_n_steps: int | None = None

    def __post_init__(self) -> None:
        def positive(name: str, allow_zero: bool = False) -> None:
            value = getattr(self, name)
            low = 0 if allow_zero else 1
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise ValueError(f"checkpoint.{name}={value!r} must be null or an integer >= {low}")

        positive("every_n_steps")
        positive("every_n_epochs")
        positive("keep_last", allow_zero=True)
        positive("keep_best", allow_zero=True)
        positive("signal_check_every_n_steps")
        if self.format not in FORMATS:
            raise ValueError(f"checkpoint.format={self.format!r} is not one of {', '.join(FORMATS)}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"checkpoint.mode={self.mode!r} is not one of min, max")

    @property
    def enabled(self) -> bool:
        return bool(self.every_n_steps or self.every_n_epochs or self.save_last or self.save_on_signal)

    @classmethod
    def from_any(cls, value: CheckpointConfig | Mapping[str, Any] | None) -> CheckpointConfig | None:
        """From a config mapping (unknown keys are an error naming them and the known ones)."""
        if value is None or isinstance(value, CheckpointConfig):
            return value
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown checkpoint option(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(value))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
