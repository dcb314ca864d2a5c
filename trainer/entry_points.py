"""What ``Trainer.fit`` / ``validate`` / ``test`` / ``predict`` check in the caller's process before
any worker starts: which module and datamodule a call runs, and what cannot work with them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.api.datamodule import check_datamodule
from trainer.api.module import TrainModule

if TYPE_CHECKING:
    from trainer.api.datamodule import DataModule
    from trainer.trainer import Trainer


def resolve_call(trainer: Trainer, module: TrainModule | None, datamodule: DataModule | None,
                 mode: str) -> TrainModule:
    """The module ``mode`` runs, with ``trainer.api.datamodule`` and ``trainer.stage`` set for the call.

    ``module=None`` (validate / test / predict) reuses the module of this trainer's last ``fit``,
    and then ``datamodule=None`` reuses that fit's datamodule too; a module given explicitly runs
    with the datamodule given (or none)."""
    check_datamodule(datamodule)
    if module is None:
        fitted = getattr(trainer, "_fitted", None)
        if mode == "fit" or fitted is None:
            raise ValueError(f"Trainer.{mode}() needs a module: "
                             + ("pass the TrainModule to train" if mode == "fit" else
                                f"this trainer has not fitted one to reuse; call trainer.{mode}(module)"))
        module = fitted[0]
        if datamodule is None:
            datamodule = fitted[1]
    if not isinstance(module, TrainModule):
        raise TypeError(f"Trainer.{mode} expects a TrainModule, got {type(module).__name__}")
    if mode in ("test", "predict"):
        _check_evaluation(trainer, module, mode)
    trainer.datamodule, trainer.stage = datamodule, mode
    return module


def _check_evaluation(trainer: Trainer, module: TrainModule, mode: str) -> None:
    if trainer.strategy.owns_step:
        # Refused rather than run the pipeline's loss-only forward under test_step's name.
        raise ValueError(
            f"Trainer.{mode} is not supported with strategy={trainer.strategy.name}: the pipeline runs only "
            f"pipeline_loss(), not {mode}_step(); run {mode} with strategy=single, ddp or fsdp on the trained "
            f"weights (ckpt_path='last' or a checkpoint path: checkpoints load on any strategy)"
        )
    if mode == "test" and type(module).test_step is TrainModule.test_step:
        raise ValueError(f"Trainer.test: {type(module).__name__} does not override test_step(); return the loss or "
                         "a dict of metrics from it (they are logged as test/<name>)")


def remember_fitted(trainer: Trainer, module: TrainModule, mode: str) -> None:
    """After a ``fit``: its module and datamodule, reused by ``validate()`` / ``test()`` / ``predict()``."""
    if mode == "fit":
        trainer._fitted = (module, trainer.datamodule)


def launch_result(mode: str, results: Any, received: Any) -> Any:
    """What the caller of spawned workers gets: ``predict``'s outputs come through the result file
    (``received``; never the pipe, which would block on large outputs), the metrics through the pipe."""
    return received if mode == "predict" else results
