"""LearningRateMonitor: log every parameter group's learning rate (and momentum, weight decay)."""

from __future__ import annotations

from typing import Any

from trainer.api.callback import Callback, run_of


class LearningRateMonitor(Callback):
    """Logs ``lr/group{i}`` for every parameter group ``i`` of the optimizer on logging steps; under
    ``{name}/group{i}`` instead when a scheduler of ``configure_optimizers`` has a ``name`` (Lightning's
    scheduler-dict key; each named scheduler of the optimizer gives its own keys). Several optimizers
    (manual optimization): ``lr/optimizer{k}/group{i}`` for optimizer ``k``, or its schedulers' names.

    The value logged at step k is the one the optimizer holds after step k's scheduler update,
    i.e. the learning rate step k+1 uses (the same convention as ``train/lr``). Reading the
    optimizer's groups costs no device sync; only logging steps write anything.

    Args:
        log_momentum: also log ``momentum/group{i}``: SGD's ``momentum``, or ``betas[0]`` for Adam-like
            optimizers (groups with neither are skipped).
        log_weight_decay: also log ``weight_decay/group{i}``.
    """

    def __init__(self, log_momentum: bool = False, log_weight_decay: bool = False):
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay

    def values(self, optimizer: Any, names: list[str] | tuple[str, ...] = ()) -> dict[str, float]:
        """The metrics this callback logs for ``optimizer``'s current parameter groups (learning rates
        under each of ``names``, or "lr" if there are none)."""
        values: dict[str, float] = {}
        for index, group in enumerate(optimizer.param_groups):
            for name in names or ("lr",):
                values[f"{name}/group{index}"] = float(group["lr"])
            if self.log_momentum:
                momentum = group["betas"][0] if "betas" in group else group.get("momentum")
                if momentum is not None:
                    values[f"momentum/group{index}"] = float(momentum)
            if self.log_weight_decay and "weight_decay" in group:
                values[f"weight_decay/group{index}"] = float(group["weight_decay"])
        return values

    def on_train_step_end(self, trainer: Any, module: Any, step: int, metrics: dict[str, float] | None) -> None:
        if metrics is None:  # not a logging step
            return
        view = run_of(trainer)
        optimizers = view.optimizers
        values: dict[str, float] = {}
        for index, optimizer in enumerate(optimizers):  # several: manual optimization
            names = [c.name for c in view.lr_scheduler_configs
                     if c.name is not None and (len(optimizers) == 1 or c.scheduler.optimizer is optimizer)]
            if len(optimizers) > 1 and not names:
                names = [f"lr/optimizer{index}"]  # "lr/optimizer{i}/group{j}": Lightning's "lr-Adam-1" ...
            values.update(self.values(optimizer, names))
        view.log(values)
