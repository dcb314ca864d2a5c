"""Lightning hooks this trainer never calls, and the check that refuses a module or callback defining one.

Used by ``Trainer`` (for the module) and ``trainer/callbacks/callback_list.py`` (for callbacks).
"""

from __future__ import annotations

from typing import Any

#: Lightning's hooks (LightningModule and Callback) that this trainer does not call. A subclass that
#: defines one expects it to run: ``refuse_unknown_hooks`` makes that an error. A name stops being refused as soon as the base class defines it.
LIGHTNING_HOOKS = (
    "setup", "teardown", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_model_eval", "on_validation_model_train",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
    "on_save_checkpoint", "on_load_checkpoint", "on_exception", "on_sanity_check_start", "on_sanity_check_end",
    "on_before_batch_transfer", "on_after_batch_transfer", "transfer_batch_to_device", "backward",
    "optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "configure_gradient_clipping",
    "configure_callbacks", "training_epoch_end", "validation_epoch_end", "training_step_end", "validation_step_end",
    "on_epoch_start", "on_epoch_end", "test_step", "test_dataloader", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end", "predict_step",
    "predict_dataloader", "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end",
)


def refuse_unknown_hooks(obj: Any, base: type, kind: str) -> None:
    """An error if ``obj``'s class defines a Lightning hook that ``base`` (TrainModule, Callback) lacks."""
    unknown = [name for name in LIGHTNING_HOOKS if not hasattr(base, name) and callable(getattr(type(obj), name, None))]
    if unknown:
        hooks = sorted(name for name in dir(base) if name.startswith("on_") and callable(getattr(base, name)))
        raise TypeError(
            f"{type(obj).__name__} defines {', '.join(n + '()' for n in unknown)}, which the trainer never calls "
            f"(a Lightning hook it does not have); the {kind} hooks are {', '.join(hooks)}: move that code into one "
            "of them (where each fires: the docstring of trainer/api/module.py)"
        )
