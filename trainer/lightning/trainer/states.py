"""Lightning's ``lightning.pytorch.trainer.states``: the values ``trainer.state`` holds, as string
enums (``TrainerFn.FITTING == "fit"``), and ``TrainerState`` (``trainer.state``'s type:
``status`` / ``fn`` / ``stage``, ``finished``, ``stopped``: trainer/api/run_state.py)."""

from __future__ import annotations

from enum import Enum

from trainer.api.run_state import TrainerState


class _StrEnum(str, Enum):
    """A string enum equal to its value (``TrainerFn.FITTING == "fit"``), as Lightning's ``LightningEnum``."""

    def __str__(self) -> str:
        return self.value

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())


class TrainerStatus(_StrEnum):
    """``trainer.state.status``: where the trainer's last call stands."""

    INITIALIZING = "initializing"  # no call yet
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"  # the call raised (a KeyboardInterrupt included)

    @property
    def stopped(self) -> bool:
        """Whether the call is over (finished or interrupted)."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(_StrEnum):
    """``trainer.state.fn``: the Trainer's call."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """``trainer.state.stage``: what runs now within the call."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Whether this stage evaluates (validation, test, the sanity check)."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The ``*_dataloader`` hook this stage reads ("val" for validation and the sanity check)."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]
