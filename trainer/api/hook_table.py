"""Every notification hook a run calls, who receives it and in which order: the one table the loop's
dispatcher (``trainer/loop/hooks.py``) reads.

The order is Lightning's: callbacks before the module for every hook the two share, the datamodule
first for ``setup`` / ``teardown``. ``on_train_epoch_end`` is split as Lightning splits it: the
callbacks that watch metrics (EarlyStopping, checkpointing; ``Callback.watches_metrics``) run after
the module's hook, so they see what it logged.

Hooks that replace behaviour rather than notify (``backward``, ``optimizer_step``,
``optimizer_zero_grad``, ``configure_gradient_clipping``, ``lr_scheduler_step``, the batch transfer
hooks) have defaults on the module that do what the trainer would do; the loop calls them where
Lightning does (``trainer/loop/train_step.py``).
"""

from __future__ import annotations

MODULE, DATAMODULE, CALLBACKS = "module", "datamodule", "callbacks"
_SHARED = (CALLBACKS, MODULE)

#: hook -> the receivers, in call order
RECEIVERS: dict[str, tuple[str, ...]] = {
    "setup": (DATAMODULE, CALLBACKS, MODULE),
    "teardown": (DATAMODULE, CALLBACKS, MODULE),
    "on_exception": (CALLBACKS, DATAMODULE),
    "on_fit_start": _SHARED, "on_fit_end": _SHARED,
    "on_sanity_check_start": (CALLBACKS,), "on_sanity_check_end": (CALLBACKS,),
    "on_train_start": _SHARED, "on_train_end": _SHARED,
    "on_train_epoch_start": _SHARED, "on_train_epoch_end": _SHARED,
    "on_train_batch_start": _SHARED, "on_train_batch_end": _SHARED,
    "on_train_step_end": _SHARED,
    "on_before_zero_grad": _SHARED, "on_before_backward": _SHARED, "on_after_backward": _SHARED,
    "on_before_optimizer_step": _SHARED,
    "on_validation_model_zero_grad": (MODULE,),
    "on_validation_model_eval": (MODULE,), "on_validation_model_train": (MODULE,),
    "on_test_model_eval": (MODULE,), "on_test_model_train": (MODULE,),
    "on_predict_model_eval": (MODULE,),
    # a checkpoint's own dict: filled on save (rank 0), given back on resume (every rank; the module
    # first, then the datamodule's state, then the callbacks: Lightning's restore order)
    "on_save_checkpoint": _SHARED, "on_load_checkpoint": (MODULE, CALLBACKS),
}
for _stage in ("validation", "test", "predict"):
    for _when in ("start", "end"):
        RECEIVERS[f"on_{_stage}_{_when}"] = _SHARED
        RECEIVERS[f"on_{_stage}_epoch_{_when}"] = _SHARED
        RECEIVERS[f"on_{_stage}_batch_{_when}"] = _SHARED

#: hooks whose last argument is ours, not Lightning's: an override of Lightning's shape (without it)
#: is called without it (``on_train_epoch_end(self)``, ``on_validation_end(self, trainer, module)``)
OPTIONAL_LAST_ARGUMENT = frozenset({"on_train_epoch_end", "on_validation_end"})

#: module hooks that replace behaviour, and the loop's default for each (what the base class does)
BEHAVIOUR_HOOKS = (
    "backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
)

#: hooks that cannot mean under a strategy what they mean in Lightning: (strategy attribute that is
#: true for such a strategy, why). Refused when the Trainer starts a call (trainer/loop/hooks.py).
PER_MICRO_BATCH_HOOKS = ("on_before_backward", "on_after_backward", "backward", "on_before_zero_grad",
                         "optimizer_zero_grad", "optimizer_step", "configure_gradient_clipping",
                         "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
