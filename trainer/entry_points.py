"""What ``Trainer.fit`` / ``validate`` / ``test`` / ``predict`` check in the caller's process before
any worker starts: which module and datamodule a call runs, and what cannot work with them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from trainer.api.datamodule import DataModule, check_datamodule
from trainer.api.lightning_hooks import check_hooks
from trainer.api.module import TrainModule
from trainer.data.ready_batches import is_ready_batches
from trainer.loop.resume import resolve_ckpt_path
from trainer.loop.weights_return import refuse_stale_module

if TYPE_CHECKING:
    from trainer.trainer import Trainer


#: Which data stage each loader argument of an entry point gives (Lightning's keywords).
LOADER_ARGUMENTS = {
    "fit": {"train_dataloaders": "train", "val_dataloaders": "val"},
    "validate": {"dataloaders": "val"},
    "test": {"dataloaders": "test"},
    "predict": {"dataloaders": "predict"},
}


def call_arguments(mode: str, model: Any, module: Any, loaders: dict[str, Any], datamodule: Any,
                   ckpt_path: Any, verbose: Any = True) -> tuple[Any, dict[str, Any], Any]:
    """Lightning's arguments of an entry point, as this trainer runs them: ``(module, loaders by
    stage, datamodule)``. ``module=`` is another name for ``model=``; a DataModule given where a
    loader goes is the datamodule (as Lightning); each loader must be one DataLoader."""
    if model is not None and module is not None:
        raise TypeError(f"Trainer.{mode}: model= and module= name the same argument; give one")
    if not isinstance(verbose, bool):
        raise ValueError(f"Trainer.{mode}: verbose={verbose!r}; give True or False")
    model = module if model is None else model
    if isinstance(datamodule, (str, os.PathLike)):  # e.g. an old predict(module, datamodule, ckpt_path) call
        raise TypeError(f"Trainer.{mode}: datamodule={datamodule!r} is a path; give the checkpoint by keyword, "
                        f"trainer.{mode}(model, ckpt_path={datamodule!r})")
    by_stage = {}
    for name, loader in loaders.items():
        if loader is None:
            continue
        if isinstance(loader, DataModule):
            if datamodule is not None:
                raise ValueError(f"Trainer.{mode}: a DataModule given both as {name}= and as datamodule=; give it once")
            datamodule = loader
            continue
        if isinstance(loader, (str, os.PathLike)):
            raise TypeError(f"Trainer.{mode}: {name}={loader!r} is a path; Lightning's argument order puts the "
                            f"loaders first: give the checkpoint by keyword, trainer.{mode}(model, ckpt_path={loader!r})")
        several = list(loader.values()) if isinstance(loader, dict) else loader if isinstance(loader, (list, tuple)) else None
        evaluation = mode in ("validate", "test", "predict") or name == "val_dataloaders"
        if several and all(isinstance(each, DataLoader) or is_ready_batches(each) for each in several):
            pass  # several loaders: evaluation runs them one after the other, training cycles them together
        elif not isinstance(loader, DataLoader) and not is_ready_batches(loader):
            raise TypeError(f"Trainer.{mode}: {name}= must be a torch.utils.data.DataLoader, a list or dict of them, an "
                            f"iterable of ready batches (or a DataModule), got {type(loader).__name__}")
        by_stage[LOADER_ARGUMENTS[mode][name]] = loader
    if by_stage and datamodule is not None:
        raise ValueError(f"Trainer.{mode}: give the data either as {' / '.join(LOADER_ARGUMENTS[mode])}= or as "
                         "datamodule=, not both")
    if isinstance(ckpt_path, (DataModule, DataLoader)):
        raise TypeError(f"Trainer.{mode}: ckpt_path= got a {type(ckpt_path).__name__}; give it as "
                        f"{'datamodule' if isinstance(ckpt_path, DataModule) else next(iter(LOADER_ARGUMENTS[mode]))}=")
    return model, by_stage, datamodule


def prepare_call(trainer: Trainer, mode: str, model: Any, module: Any, loaders: dict[str, Any], datamodule: Any,
                 ckpt_path: Any, verbose: Any = True) -> TrainModule:
    """Everything checked before any worker starts, for one call of ``mode``: Lightning's arguments
    (``call_arguments``), which module and datamodule run (``resolve_call``), the hooks, the strategy's
    view of the module, what ``ckpt_path`` loads. Returns the module the call runs, with this call's
    ``trainer.datamodule`` / ``stage`` / ``given_loaders`` / ``ckpt_path`` set (the last writes before
    the run; the Trainer is read-only while it is live)."""
    model, loaders_by_stage, datamodule = call_arguments(mode, model, module, loaders, datamodule, ckpt_path, verbose)
    module = resolve_call(trainer, model, datamodule, mode, loaders_by_stage)
    check_hooks(module, trainer.callbacks, trainer.datamodule, trainer.strategy)
    trainer.strategy.check_module(module)  # (nd: the tensor-parallel degree and plan)
    trainer.ckpt_path = resolve_ckpt_path(ckpt_path, trainer.resume, trainer.checkpoint)
    if mode != "fit" and trainer.ckpt_path is None:
        refuse_stale_module(module, mode)
    return module


def resolve_call(trainer: Trainer, module: TrainModule | None, datamodule: DataModule | None,
                 mode: str, loaders: dict[str, Any] | None = None) -> TrainModule:
    """The module ``mode`` runs, with ``trainer.datamodule`` and ``trainer.stage`` set for the call.

    ``module=None`` (validate / test / predict) reuses the module of this trainer's last ``fit``,
    and then ``datamodule=None`` reuses that fit's datamodule too (unless loaders are given); a module
    given explicitly runs with the datamodule given (or none). ``loaders``: this call's DataLoaders
    by stage (``call_arguments``), never reused by a later call (as Lightning)."""
    check_datamodule(datamodule)
    if module is None:
        fitted = getattr(trainer, "_fitted", None)
        if mode == "fit" or fitted is None:
            raise ValueError(f"Trainer.{mode}() needs a module: "
                             + ("pass the TrainModule to train" if mode == "fit" else
                                f"this trainer has not fitted one to reuse; call trainer.{mode}(module)"))
        module = fitted[0]
        if datamodule is None and not loaders:
            datamodule = fitted[1]
    if not isinstance(module, TrainModule):
        raise TypeError(f"Trainer.{mode} expects a TrainModule, got {type(module).__name__}")
    if mode in ("validate", "test", "predict"):
        _check_evaluation(trainer, module, mode)
    trainer.datamodule, trainer.stage = datamodule, mode
    trainer.given_loaders = dict(loaders or {})  # this call's loader arguments, by stage (not kept for the next)
    if datamodule is not None:
        datamodule.trainer = trainer  # as Lightning: the datamodule reads the trainer (world_size, ...)
    return module


def _check_evaluation(trainer: Trainer, module: TrainModule, mode: str) -> None:
    if mode == "validate":  # (the pipeline validates with pipeline_loss(), without validation_step())
        if not trainer.strategy.owns_step and type(module).validation_step is TrainModule.validation_step:
            raise ValueError(f"Trainer.validate: {type(module).__name__} does not override validation_step(); return "
                             "the loss or a dict of metrics from it")
        return
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
