"""Where ``self.log`` may be called: one row per hook name (module and callback hooks alike), with
Lightning's rules for that hook (which ``on_step`` / ``on_epoch`` values it accepts and its
defaults), the stage its values belong to, and whether a value weighs as the current batch.

The hook that logs is found by name: the innermost frame of the user's code (outside this
package) whose function is named like a hook in `HOOKS`. A hook therefore needs no change
here to start logging once the loop fires it; a name whose row is ``None`` refuses ``self.log``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class HookLogging:
    """What ``self.log`` accepts in one hook and where its values go."""

    allowed_on_step: tuple[bool, ...]
    allowed_on_epoch: tuple[bool, ...]
    default_on_step: bool
    default_on_epoch: bool
    stage: str | None  # "train", "validate", "test"; None: the stage that runs
    per_batch: bool = False  # a value weighs as the batch just run (its real samples), else 1 per rank


def _step(stage: str | None, per_batch: bool = False) -> HookLogging:
    """A training-step hook: per-step by default, either level allowed."""
    return HookLogging((False, True), (False, True), True, False, stage, per_batch)


def _eval_step(stage: str, per_batch: bool = False) -> HookLogging:
    """An evaluation step hook: aggregated over the run by default, either level allowed."""
    return HookLogging((False, True), (False, True), False, True, stage, per_batch)


def _once(stage: str) -> HookLogging:
    """A start / epoch hook: epoch values only."""
    return HookLogging((False,), (True,), False, True, stage)


#: hook name -> its logging rule, or None where ``self.log`` is refused (as Lightning refuses it).
HOOKS: dict[str, HookLogging | None] = {
    "training_step": _step("train"),
    "on_train_batch_start": _step("train"),
    "on_train_batch_end": _step("train", per_batch=True),
    "on_before_backward": _step("train", per_batch=True),
    "backward": _step("train", per_batch=True),
    "on_after_backward": _step("train", per_batch=True),
    "on_before_optimizer_step": _step("train"),
    "optimizer_step": _step("train"),
    "configure_gradient_clipping": _step("train"),
    "clip_gradients": _step("train"),
    "on_before_zero_grad": _step("train"),
    "optimizer_zero_grad": _step("train"),
    "on_train_start": _once("train"),
    "on_train_epoch_start": _once("train"),
    "on_train_epoch_end": _once("train"),
    "validation_step": _eval_step("validate"),
    "on_validation_batch_start": _eval_step("validate"),
    "on_validation_batch_end": _eval_step("validate", per_batch=True),
    "on_validation_start": _once("validate"),
    "on_validation_epoch_start": _once("validate"),
    "on_validation_epoch_end": _once("validate"),
    "test_step": _eval_step("test"),
    "on_test_batch_start": _eval_step("test"),
    "on_test_batch_end": _eval_step("test", per_batch=True),
    "on_test_start": _once("test"),
    "on_test_epoch_start": _once("test"),
    "on_test_epoch_end": _once("test"),
    **dict.fromkeys((
        "lr_scheduler_step", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
        "on_train_end", "on_validation_end", "on_test_end", "on_predict_start", "on_predict_end",
        "on_predict_epoch_start", "on_predict_epoch_end", "on_before_batch_transfer", "transfer_batch_to_device",
        "on_after_batch_transfer", "on_predict_batch_start", "on_predict_batch_end", "on_exception", "state_dict",
        "on_save_checkpoint", "on_load_checkpoint", "load_state_dict", "setup", "teardown", "configure_model",
        "configure_sharded_model", "predict_step", "configure_optimizers", "train_dataloader", "val_dataloader",
        "test_dataloader", "predict_dataloader", "prepare_data", "configure_callbacks", "on_validation_model_eval",
        "on_validation_model_train", "on_test_model_eval", "on_test_model_train", "on_validation_model_zero_grad",
    )),
}

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # trainer/
# The recipes ship inside the package but are modules as a user writes them: their frames are the user's.
_RECIPES = os.path.join(_PACKAGE, "recipes") + os.sep


def calling_hook(depth: int = 2) -> tuple[str | None, str]:
    """``(hook, function)``: the innermost hook of `HOOKS` among the user's frames that led to
    this call (None if none), and the user's innermost function (for messages)."""
    frame = sys._getframe(depth)
    user = None
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE) or code.co_filename.startswith(_RECIPES):
            if user is None:
                user = code.co_name
            if code.co_name in HOOKS:
                return code.co_name, user
        frame = frame.f_back
    return None, user or "?"


def allowed_hooks() -> str:
    """The hooks that may log, for messages."""
    return ", ".join(name for name, rule in HOOKS.items() if rule is not None)
