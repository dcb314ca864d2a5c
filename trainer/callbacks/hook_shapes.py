"""Callback hooks take ``(trainer, module, ...)`` (Lightning's shape). A callback written for the
earlier shape (``on_fit_start(self, run)``, ``on_train_step_end(self, run, step, metrics)``) would
fail with a bare TypeError at its first call, possibly hours into a run; it is refused when the
Trainer is built instead, with the shape to use."""

from __future__ import annotations

import inspect
from typing import Any

from trainer.api.hook_table import OPTIONAL_LAST_ARGUMENT

#: each public hook's arguments after ``self``
HOOK_ARGUMENTS = {
    "on_fit_start": ("trainer", "module"),
    "on_train_epoch_start": ("trainer", "module"),
    "on_train_batch_start": ("trainer", "module", "batch", "batch_idx"),
    "on_train_batch_end": ("trainer", "module", "outputs", "batch", "batch_idx"),
    "on_train_step_end": ("trainer", "module", "step", "metrics"),
    "on_validation_epoch_start": ("trainer", "module"),
    "on_validation_batch_end": ("trainer", "module", "outputs", "batch", "batch_idx"),
    "on_validation_epoch_end": ("trainer", "module"),
    "on_validation_end": ("trainer", "module", "metrics"),
    "on_train_epoch_end": ("trainer", "module"),
    "on_fit_end": ("trainer", "module"),
    "on_save_checkpoint": ("trainer", "module", "checkpoint"),
    "on_load_checkpoint": ("trainer", "module", "checkpoint"),
}


def check_hook_shapes(callback: Any, base: type) -> None:
    """A TypeError naming the hook and its shape for an override that cannot take the hook's arguments,
    or whose first argument is the former ``run``."""
    for hook, arguments in HOOK_ARGUMENTS.items():
        method = getattr(type(callback), hook, None)
        if method is None or method is getattr(base, hook, None):
            continue
        try:
            parameters = list(inspect.signature(getattr(callback, hook)).parameters)
            signature = inspect.signature(getattr(callback, hook))
            try:
                signature.bind(*arguments)
            except TypeError:
                if hook not in OPTIONAL_LAST_ARGUMENT:
                    raise
                signature.bind(*arguments[:-1])  # Lightning's shape, without our last argument
            fits = not parameters or parameters[0] != "run"
        except TypeError:
            fits = False
        except ValueError:  # no signature to read: it is called as is
            fits = True
        if not fits:
            shape = f"{hook}(self, {', '.join(arguments)})"
            raise TypeError(f"{type(callback).__name__}.{hook} does not take ({', '.join(arguments)}): callback hooks "
                            f"have Lightning's shape {shape}; what the former 'run' argument gave is "
                            "trainer.callbacks.run_of(trainer) (see trainer/api/callback.py)")
