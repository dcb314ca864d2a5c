"""What the Trainer checks across its arguments when it is built, and of the launcher's environment
when a call starts: each a one-line error naming the setting and what to give instead."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from trainer.runtime.value_checks import require
from trainer.callbacks import Callback, Timer
from trainer.checkpoint.config import CheckpointConfig
from trainer.loggers.base import DummyLogger
from trainer.loop.run_limits import (check_epoch_interval, check_limit, check_min_run, check_sanity_steps,
                                     fast_dev_run_steps, merge_val_interval, overfit_limit, resolve_run_dir)
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.strategies import Strategy

log = logging.getLogger(__name__)


def with_timer(callbacks: list[Callback], max_time: Any) -> list[Callback]:
    """``max_time``: a ``Timer`` after the other callbacks (refused next to a Timer of the user's)."""
    if max_time is None:
        return callbacks
    require(not any(isinstance(callback, Timer) for callback in callbacks),
            "trainer.max_time and a Timer callback both limit the time: keep one")
    return [*callbacks, Timer(max_time)]


def check_accelerator(strategy: str | Strategy, accelerator: str, cuda_devices: Callable[[], int]) -> None:
    """A Strategy instance carries its own accelerator: ``trainer.accelerator`` may not contradict it.
    CUDA asked for where ``cuda_devices()`` sees none: refused before any worker starts."""
    require(
        not isinstance(strategy, Strategy) or strategy.accelerator == accelerator or accelerator == "auto",
        f"trainer.accelerator={accelerator!r} differs from the strategy's accelerator="
        f"{getattr(strategy, 'accelerator', None)!r}; give it to the strategy "
        f"({type(strategy).__name__}(accelerator={accelerator!r})) or leave trainer.accelerator at 'auto'",
    )
    if "cuda" in (accelerator, getattr(strategy, "accelerator", None)) and cuda_devices() == 0:
        raise ValueError("accelerator='cuda' but torch.cuda.is_available() is False on this machine (no CUDA device "
                         "this process can use); give accelerator='cpu' or 'auto'")


def devices_for(strategy: Strategy, devices: int, num_nodes: int) -> tuple[int, int]:
    """``(devices, num_nodes)`` the strategy runs on: a one-process strategy ignores more, with a warning."""
    if devices * num_nodes > 1 and not strategy.supports_multiple_devices:
        rank_zero_warn(log, "strategy=%s runs one process; ignoring trainer.devices=%d x trainer.num_nodes=%d "
                       "(choose strategy=ddp to use them)", strategy.name, devices, num_nodes)
        return 1, 1
    return devices, num_nodes


def check_strategy_settings(strategy: Strategy, checkpoint: CheckpointConfig | None, sync_batchnorm: bool) -> None:
    """The checkpoint format and SyncBatchNorm the strategy supports."""
    formats: Sequence[str] = strategy.checkpoint_formats
    require(
        checkpoint is None or checkpoint.format in formats,
        f"checkpoint.format={getattr(checkpoint, 'format', None)!r} is not supported with "
        f"strategy={strategy.name}; use one of {list(formats)}"
        + (" (python -m trainer.checkpoint consolidate PATH OUT makes one full file afterwards)"
           if "sharded" in formats else ""),
    )
    require(not (sync_batchnorm and strategy.sync_batchnorm_refusal),
            f"trainer.sync_batchnorm=true is not supported with strategy={strategy.name}: "
            f"{strategy.sync_batchnorm_refusal}")


def check_environment(env: ClusterEnvironment, strategy: Strategy, devices: int, num_nodes: int) -> None:
    """The launcher's processes (torchrun, srun) match ``devices x num_nodes``; without one, one node."""
    if env.launcher == "none":
        require(num_nodes == 1, f"trainer.num_nodes={num_nodes} needs a multi-node launcher: "
                f"torchrun --nnodes {num_nodes} --nproc_per_node {devices} ... or srun")
        return
    world_size = devices * num_nodes
    require(
        env.world_size == world_size,
        f"the launcher ({env.launcher}) started {env.world_size} processes but trainer.devices={devices} x "
        f"trainer.num_nodes={num_nodes} = {world_size}; make them agree",
    )
    strategy.check_world_size(env.world_size, env.local_world_size)


def apply_run_limits(trainer: Any, fast_dev_run: Any, limit_train_batches: Any, limit_val_batches: Any, val_check_interval: Any,
          check_val_every_n_epoch: Any, num_sanity_val_steps: Any, default_root_dir: Any, run_dir: str | None,
          max_epochs: Any = None, limit_test_batches: Any = None, limit_predict_batches: Any = None,
          overfit_batches: Any = 0.0, min_epochs: Any = None, min_steps: Any = None) -> None:
    """Check Lightning's run-length arguments and set them on ``trainer`` (after its own settings;
    ``max_epochs`` as given: unset, it is 1, or ``min_epochs``, when ``max_steps`` does not bound the run)."""
    limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches = (
        check_limit(name, value, unit) for name, value, unit in (
            ("limit_train_batches", limit_train_batches, "optimizer steps per epoch"),
            ("limit_val_batches", limit_val_batches, "validation batches"),
            ("limit_test_batches", limit_test_batches, "test batches"),
            ("limit_predict_batches", limit_predict_batches, "predict batches")))
    check_min_run(min_epochs, min_steps)
    overfit = overfit_limit(overfit_batches)
    check_epoch_interval(check_val_every_n_epoch)
    check_sanity_steps(num_sanity_val_steps)
    trainer.min_epochs, trainer.min_steps, trainer.overfit_batches = min_epochs, min_steps, overfit
    if max_epochs is None and trainer.max_steps == -1:
        max_epochs = max(1, min_epochs or 0)
    trainer.max_epochs = max_epochs
    trainer.val_every_n_steps, trainer.val_check_fraction = merge_val_interval(trainer.val_every_n_steps,
                                                                               val_check_interval)
    trainer.run_dir = resolve_run_dir(run_dir, default_root_dir) or trainer.run_dir
    trainer.limit_train_batches, trainer.limit_val_batches = limit_train_batches, limit_val_batches
    trainer.limit_test_batches, trainer.limit_predict_batches = limit_test_batches, limit_predict_batches
    trainer.check_val_every_n_epoch = check_val_every_n_epoch
    trainer.num_sanity_val_steps = num_sanity_val_steps
    trainer.fast_dev_run = n = fast_dev_run_steps(fast_dev_run)
    if n:  # as Lightning: n steps, n validation batches, no sanity pass, nothing written
        log.info("fast_dev_run=%d: %d step(s) of one epoch, %d validation batch(es), no checkpoints, no loggers", n, n, n)
        trainer.max_steps, trainer.max_epochs, trainer.limit_train_batches, trainer.limit_val_batches = n, 1, n, n
        trainer.limit_test_batches = trainer.limit_predict_batches = n
        trainer.num_sanity_val_steps, trainer.checkpoint = 0, None
        # A logger that writes nothing in place of the chosen ones (as Lightning): self.logger still answers.
        trainer.logger_specs = [DummyLogger()] if trainer.logger_specs else []
    if overfit is not None:  # as Lightning: both passes limited to it, whatever else was given
        trainer.limit_train_batches = trainer.limit_val_batches = overfit
