"""The checks of ``Trainer(...)``'s plain arguments: each wrong value is an error naming it and what is
allowed. ``Trainer.__init__`` (``trainer/trainer.py``) calls them before it stores anything."""

from __future__ import annotations

import os
from typing import Any, Mapping

from trainer.runtime.value_checks import is_int, require

LOSS_NORMALIZATIONS = ("samples", "tokens")


def check_arguments(
    *, devices: Any, num_nodes: Any, batch_size: Any, accumulate_grad_batches: Any, max_steps: Any, max_epochs: Any,
    log_every_n_steps: Any, val_every_n_steps: Any, gradient_clip_val: Any, loss_normalization: Any,
    num_workers: Any, drop_last: Any, pin_memory: Any, collective_timeout_s: Any, resume: Any, init_from: Any,
    return_weights: Any = True, enable_model_summary: Any = True, seed: Any = 0,
    nonfinite_loss: Any,
) -> None:
    """Refuse a value of these ``Trainer`` arguments outside its range (the first wrong one, in this order)."""
    require(is_int(devices) and devices >= 1, f"trainer.devices must be an integer >= 1, got {devices!r} (or 'auto')")
    require(is_int(num_nodes) and num_nodes >= 1, f"trainer.num_nodes must be an integer >= 1, got {num_nodes!r}")
    require(batch_size is None or (is_int(batch_size) and batch_size >= 1),
            f"data.batch_size must be an integer >= 1, got {batch_size!r} (or null: the train loader's)")
    require(
        is_int(accumulate_grad_batches) and accumulate_grad_batches >= 1,
        f"trainer.accumulate_grad_batches must be an integer >= 1, got {accumulate_grad_batches!r}",
    )
    require(is_int(max_steps) and (max_steps == -1 or max_steps >= 1), f"trainer.max_steps must be -1 or >= 1, got {max_steps!r}")
    require(max_epochs is None or (is_int(max_epochs) and max_epochs >= 1), f"trainer.max_epochs must be None or >= 1, got {max_epochs!r}")
    require(is_int(log_every_n_steps) and log_every_n_steps >= 1, f"trainer.log_every_n_steps must be >= 1, got {log_every_n_steps!r}")
    require(
        val_every_n_steps is None or (is_int(val_every_n_steps) and val_every_n_steps >= 1),
        f"trainer.val_every_n_steps must be None or >= 1, got {val_every_n_steps!r}",
    )
    require(
        gradient_clip_val is None or gradient_clip_val > 0,
        f"trainer.gradient_clip_val must be None or > 0, got {gradient_clip_val!r}",
    )
    require(
        loss_normalization in LOSS_NORMALIZATIONS,
        f"trainer.loss_normalization={loss_normalization!r} is not one of {LOSS_NORMALIZATIONS}",
    )
    require(num_workers is None or (is_int(num_workers) and num_workers >= 0),
            f"data.num_workers must be >= 0, got {num_workers!r} (or null: the train loader's)")
    for name, flag in (("drop_last", drop_last), ("pin_memory", pin_memory)):
        require(flag is None or isinstance(flag, bool), f"data.{name} must be true, false or null (unset), got {flag!r}")
    require(collective_timeout_s > 0, f"trainer.collective_timeout_s must be > 0, got {collective_timeout_s!r}")

    require(
        resume is None or resume == "auto" or os.path.exists(resume),
        f"trainer.resume={resume!r} does not exist; give auto, a checkpoint directory or a directory of checkpoints",
    )
    require(init_from is None or os.path.isfile(init_from) or os.path.isfile(os.path.join(init_from, "model.safetensors"))
            or os.path.isfile(os.path.join(init_from, "model.safetensors.index.json")),
            f"trainer.init_from={init_from!r} is neither a file of weights nor a directory of safetensors "
            "(model.safetensors or model.safetensors.index.json)")
    require(nonfinite_loss in ("error", "ignore"), f"trainer.nonfinite_loss={nonfinite_loss!r} is not one of error, ignore")
    for name, flag in (("return_weights", return_weights), ("enable_model_summary", enable_model_summary)):
        require(isinstance(flag, bool), f"trainer.{name} must be true or false, got {flag!r}")
    require(is_int(seed), f"trainer.seed={seed!r} must be an integer")


def check_lightning_flags(enable_progress_bar: Any, progress_bar: Any, deterministic: Any, benchmark: Any,
                          inference_mode: Any, gradient_clip_algorithm: Any, detect_anomaly: Any = False) -> Any:
    """Check Lightning's ``Trainer`` flags; returns ``progress_bar`` merged with ``enable_progress_bar``."""
    for name, value in (("enable_progress_bar", enable_progress_bar), ("benchmark", benchmark)):
        require(value is None or isinstance(value, bool), f"trainer.{name} must be true, false or null, got {value!r}")
    require(enable_progress_bar is None or progress_bar is None or enable_progress_bar == progress_bar,
            f"trainer.enable_progress_bar={enable_progress_bar!r} and trainer.progress_bar={progress_bar!r} name the "
            "same setting; give one")
    require(deterministic is None or isinstance(deterministic, bool) or deterministic == "warn",
            f"trainer.deterministic must be true, false, 'warn' or null, got {deterministic!r}")
    for name, flag in (("inference_mode", inference_mode), ("detect_anomaly", detect_anomaly)):
        require(isinstance(flag, bool), f"trainer.{name} must be true or false, got {flag!r}")
    require(gradient_clip_algorithm in (None, "norm", "value"),
            f"trainer.gradient_clip_algorithm={gradient_clip_algorithm!r}: give 'norm' (the global 2-norm) or 'value' "
            "(each element)")
    if deterministic is True and benchmark is True:
        import logging

        from trainer.runtime.rank_logging import rank_zero_warn

        rank_zero_warn(logging.getLogger("trainer"), "trainer.deterministic=True and trainer.benchmark=True: cuDNN's "
                       "autotuner may pick nondeterministic kernels; set benchmark=False (or leave it unset)")
    return progress_bar if enable_progress_bar is None else enable_progress_bar


def validates_during_training(trainer: Any) -> bool:
    """Whether ``fit`` validates before the end of training: every N steps (``val_every_n_steps`` /
    ``val_check_interval``) or at epoch ends (``check_val_every_n_epoch``); else only once, at the end."""
    return bool(trainer.val_every_n_steps or getattr(trainer, "val_check_fraction", None)
                or getattr(trainer, "check_val_every_n_epoch", None))


def profile_options(profile: Mapping[str, Any] | None) -> dict[str, Any]:
    """``trainer.profile`` with its defaults, checked; step ranges as tuples."""
    options = {"wall_clock_breakdown": False, "trace_steps": None, "comms_steps": None, **dict(profile or {})}
    unknown = sorted(set(options) - {"wall_clock_breakdown", "trace_steps", "comms_steps"})
    require(not unknown, f"unknown trainer.profile option(s) {unknown}; known: wall_clock_breakdown, trace_steps, comms_steps")
    for key in ("trace_steps", "comms_steps"):
        steps = options[key]
        require(
            steps is None or (len(steps) == 2 and all(is_int(s) for s in steps) and 1 <= steps[0] <= steps[1]),
            f"trainer.profile.{key}={steps!r}: give [first, last] with 1 <= first <= last, or null",
        )
        options[key] = None if steps is None else tuple(steps)
    return options
