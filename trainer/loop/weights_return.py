"""What the caller of ``Trainer.fit`` / ``validate`` gets back when the work ran elsewhere.

In-process runs (one process, or a rank under torchrun) train the caller's module itself. Spawned
workers train copies: at the end rank 0 writes the run's result to a file in the run directory
(never a pipe: the weights may be large), gathered with the strategy's ``full_state_dict`` (a
collective, once per call, not per step); the launcher loads it into the caller's module and
deletes the file. ``trainer.return_weights=false`` skips the weights (models too big for one
process's memory): the module then keeps its initial weights and is marked, so that validating it
without a checkpoint is an error instead of silently measuring untrained weights.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from trainer.loop.rank_run import _Run
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)

RESULT_FILE = ".fit_result.pt"
#: set on a module whose spawned fit did not copy its weights back: the run directory
STALE_MARK = "_trainer_weights_left_in"


def record_result(run: _Run, mode: str) -> None:
    """On every rank after a clean ``fit`` / ``validate``: progress and metrics on the trainer;
    under spawned workers also the result file (rank 0), with the full weights after a fit."""
    trainer = run.trainer
    hidden = sorted(run.module_logs.hidden)  # self.log(..., logger=False): not in logged_metrics
    # What callbacks saw last (the latest step values too, as Lightning's callback_metrics), as numbers.
    shown = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in run.view.callback_metrics.items()}
    set_progress(trainer, run.global_step, run.epoch, run.last_metrics, hidden, batches=run.step, shown=shown)
    if run.env.launcher != "spawned":
        return
    weights = None
    if mode == "fit" and trainer.return_weights:
        weights = run.strategy.full_state_dict(run.module)  # a collective: every rank
    if run.rank == 0:
        result = {"global_step": run.global_step, "batches": run.step, "current_epoch": run.epoch,
                  "metrics": dict(run.last_metrics), "shown": shown,
                  "hidden": hidden, "state_dict": weights, "predictions": getattr(run, "predictions", None)}  # (predict)
        path = os.path.join(run.run_dir, RESULT_FILE)
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)


def set_progress(trainer: Trainer, step: int, epoch: int, metrics: dict[str, float], hidden: Any = (),
                 batches: int | None = None, shown: dict[str, float] | None = None) -> None:
    """``step``: global_step (optimizer steps); ``batches``: the batches trained (the logged step
    axis; None: ``step``, they differ under manual optimization only). ``hidden``: names kept off the
    loggers (in ``callback_metrics``, not in ``logged_metrics``); ``shown``: ``callback_metrics``
    (None: ``metrics``)."""
    trainer.global_step, trainer.current_epoch = step, epoch
    trainer._batches = step if batches is None else batches
    trainer.callback_metrics = dict(metrics if shown is None else shown)
    trainer.logged_metrics = {k: v for k, v in metrics.items() if k not in hidden}


def receive_result(trainer: Trainer, module: nn.Module, mode: str) -> Any:
    """In the launcher after spawned workers finished: read rank 0's result file, put the progress
    on ``trainer`` and the trained weights into ``module``, delete the file. Returns what a
    ``predict`` gathered (None for the other modes)."""
    path = os.path.join(trainer.run_dir, RESULT_FILE)
    if not os.path.isfile(path):
        raise RuntimeError(f"the workers finished but left no result in {path}")
    try:
        result = torch.load(path, map_location="cpu", weights_only=True)
    finally:
        os.remove(path)
    set_progress(trainer, result["global_step"], result["current_epoch"], result["metrics"], result.get("hidden", ()),
                 result.get("batches"), result.get("shown"))
    if mode != "fit":
        return result.get("predictions")
    if result["state_dict"] is None:
        setattr(module, STALE_MARK, trainer.run_dir)
        return None
    load_full_weights(module, result["state_dict"])
    if hasattr(module, STALE_MARK):
        delattr(module, STALE_MARK)
    return None


def load_full_weights(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a full state dict (parameter and buffer names) into ``module``'s own tensors. A module
    that builds its layers in ``configure_model`` gets it called first, here in the caller."""
    own = _named_tensors(module)
    if any(name not in own for name in state):
        module.configure_model()
        own = _named_tensors(module)
    unexpected = sorted(name for name in state if name not in own)
    covered = {id(own[name]) for name in state if name in own}  # tied tensors: one name is enough
    skip = _non_persistent_buffers(module)
    missing = sorted(name for name, tensor in own.items() if id(tensor) not in covered and name not in skip)
    if unexpected or missing:
        raise RuntimeError(
            f"the trained weights do not fit {type(module).__name__} in the calling process "
            f"(missing: {missing[:5]}, unexpected: {unexpected[:5]}); does configure_model() build every layer?"
        )
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    tensors: dict[str, Any] = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    return tensors


def _non_persistent_buffers(module: nn.Module) -> set[str]:
    return {f"{prefix}.{name}" if prefix else name
            for prefix, sub in module.named_modules(remove_duplicate=False)
            for name in getattr(sub, "_non_persistent_buffers_set", ())}


def refuse_stale_module(module: nn.Module, mode: str) -> None:
    """``validate`` without a checkpoint of a module whose trained weights stayed in the workers."""
    run_dir = getattr(module, STALE_MARK, None)
    if run_dir is not None:
        raise ValueError(
            f"Trainer.{mode}: this module was fitted with trainer.return_weights=false, so it still holds its "
            f"initial weights (the trained ones are in the checkpoints of {run_dir}); pass ckpt_path=\"last\" "
            "(or a checkpoint path) to evaluate the trained model"
        )
