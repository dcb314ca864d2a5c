"""The pieces of the training step that Lightning hooks take over: the optimizer handed to an
overridden ``optimizer_step``, the batch transfer hooks, and ``on_train_batch_start``'s return value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer.api.errors import MisconfigurationException
from trainer.runtime import distributed
from trainer.runtime.tensors import move_to_device

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun


class OptimizerStep:
    """What ``optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`` receives as ``optimizer``:
    ``step(closure=...)`` runs the closure (the last micro-batch's forward and backward, the hooks
    before the step, clipping) and then the trainer's step (through the strategy and precision,
    with the schedule). Everything else is the user's optimizer's (``param_groups``, ``state`` ...)."""

    def __init__(self, optimizer: torch.optim.Optimizer, step: Callable[[], None]):
        self.optimizer = optimizer
        self._step = step

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        self._step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class EpochSkipped(Exception):
    """``on_train_batch_start`` returned -1 on some rank: the rest of the epoch is skipped on every rank."""


def skip_requested(result: Any) -> bool:
    """Whether ``on_train_batch_start`` returned Lightning's -1 (skip the rest of the epoch)."""
    return isinstance(result, int) and not isinstance(result, bool) and result == -1


def train_batch_start(run: RankRun, batch: Any, batch_idx: int) -> None:
    """``on_train_batch_start`` on its receivers. The module's -1 (callbacks' return values are not
    read, as in Lightning) skips the rest of the epoch: the batch is not trained and ``EpochSkipped`` is
    raised on every rank. Where several processes run, the ranks agree first (one tiny all-reduce on the
    CPU group per micro-batch, only for a module that overrides the hook), so a -1 on any rank skips
    the same global batch everywhere."""
    result = run.hooks.call("on_train_batch_start", batch, batch_idx)
    if not run.hooks.module_batch_start:
        return
    skip = skip_requested(result)
    if distributed.world_size() > 1:
        skip = distributed.any_rank(skip)
    if skip:
        raise EpochSkipped(batch_idx)


def transfer_batch(run: RankRun, batch: Any, non_blocking: bool = False, dataloader_idx: int = 0) -> Any:
    """``batch`` on the run's device, through ``on_before_batch_transfer``, ``transfer_batch_to_device``
    and ``on_after_batch_transfer`` where the datamodule or module overrides them (the datamodule's win)."""
    hooks = run.hooks
    if hooks.default_transfer:
        return move_to_device(batch, run.device, non_blocking=non_blocking)
    before, transfer, after = hooks.transfer_owners
    if before is not None:
        batch = before.on_before_batch_transfer(batch, dataloader_idx)
    if transfer is not None:
        batch = transfer.transfer_batch_to_device(batch, run.device, dataloader_idx)
    else:
        batch = move_to_device(batch, run.device, non_blocking=non_blocking)
    if after is not None:
        batch = after.on_after_batch_transfer(batch, dataloader_idx)
    return batch


def gradient_clipper(run: RankRun) -> Callable[..., Any]:
    """``self.clip_gradients(optimizer, val, algorithm)`` under automatic optimization (called from an
    overridden ``configure_gradient_clipping``): "norm" clips the global norm over every rank's
    shards and returns the norm before clipping, "value" clamps each element to ``[-val, val]``."""
    trainer = run.trainer
    set_val, set_algorithm = trainer.gradient_clip_val, getattr(trainer, "gradient_clip_algorithm_arg", None)

    def clip(optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None) -> Any:
        # As Lightning: the Trainer's setting fills in what the call leaves out; a different one is an error.
        for name, given, setting in (("gradient_clip_val", gradient_clip_val, set_val),
                                     ("gradient_clip_algorithm", gradient_clip_algorithm, set_algorithm)):
            if given is not None and setting is not None and given != setting:
                raise MisconfigurationException(
                    f"You have set `Trainer({name}={setting!r})` and have passed `clip_gradients({name}={given!r})`: "
                    f"give {name} in one place only")
        gradient_clip_val = set_val if gradient_clip_val is None else gradient_clip_val
        if gradient_clip_val is None:
            return None
        algorithm = gradient_clip_algorithm or set_algorithm or "norm"
        if algorithm == "norm":
            return run.strategy.clip_grad_norm(run.module, gradient_clip_val)
        if algorithm != "value":
            raise ValueError(f"clip_gradients: gradient_clip_algorithm={algorithm!r} is not one of 'norm', 'value'")
        run.strategy.clip_grad_value(run.module, gradient_clip_val)  # element-wise: each rank's shard alone
        return None
    return clip


def batch_end_outputs(output: Any, accumulate: int | None) -> dict[str, Any]:
    """What ``on_train_batch_end`` gets as ``outputs``, as Lightning builds it from ``training_step``'s
    return: a dict with "loss" detached. Automatic optimization (``accumulate``: the micro-batches
    per step): the loss divided by ``accumulate`` (Lightning's normalised closure loss) and the
    dict's other entries as returned; manual (``accumulate`` None): ``{}`` for None, the rest as returned."""
    if isinstance(output, torch.Tensor):
        output = {"loss": output}
    elif output is None:
        return {}
    elif not isinstance(output, dict):
        return output
    outputs = dict(output)
    if isinstance(outputs.get("loss"), torch.Tensor):
        loss = outputs["loss"].detach()
        outputs["loss"] = (loss / accumulate if accumulate not in (None, 1) else loss.clone())
    return outputs
