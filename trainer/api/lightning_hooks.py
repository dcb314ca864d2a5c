"""The hook checks made when a call starts: hooks of Lightning 1.x that Lightning 2 removed (a
module or callback defining one expects it to run), and hooks that cannot mean under a strategy what
they mean in Lightning. Every Lightning 2 hook is called (``trainer/api/hook_table.py``).

Used by ``Trainer`` (for the module) and ``trainer/callbacks/callback_list.py`` (for callbacks).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any
from unittest.mock import Mock

from trainer.api.hook_table import PER_MICRO_BATCH_HOOKS

if TYPE_CHECKING:
    from trainer.api.callback import Callback
    from trainer.api.module import TrainModule

#: Lightning 1.x hooks that Lightning 2 removed, with what replaced them.
LIGHTNING_HOOKS = {
    "training_epoch_end": "on_train_epoch_end (collect outputs in training_step yourself)",
    "validation_epoch_end": "on_validation_epoch_end (collect outputs in validation_step yourself)",
    "test_epoch_end": "on_test_epoch_end", "predict_epoch_end": "on_predict_epoch_end",
    "training_step_end": "training_step", "validation_step_end": "validation_step", "test_step_end": "test_step",
    "on_epoch_start": "on_train_epoch_start / on_validation_epoch_start", "on_epoch_end": "on_train_epoch_end / "
    "on_validation_epoch_end", "on_batch_start": "on_train_batch_start", "on_batch_end": "on_train_batch_end",
    "on_pretrain_routine_start": "on_fit_start", "on_pretrain_routine_end": "on_fit_start",
    "on_init_start": "__init__", "on_init_end": "__init__", "on_configure_sharded_model": "configure_model",
    "configure_sharded_model": "configure_model",
}


def refuse_unknown_hooks(obj: Any, base: type, kind: str) -> None:
    """An error if ``obj``'s class defines a Lightning hook that ``base`` (TrainModule, Callback) lacks."""
    unknown = [name for name in LIGHTNING_HOOKS if not hasattr(base, name) and callable(getattr(type(obj), name, None))]
    if unknown:
        instead = "; ".join(f"{name}() -> {LIGHTNING_HOOKS[name]}" for name in unknown)
        raise TypeError(f"{type(obj).__name__} defines {', '.join(n + '()' for n in unknown)}, Lightning 1.x hook(s) "
                        f"that Lightning 2 removed and this trainer never calls; use instead: {instead}")


def overrides(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj.<name>`` is not ``base``'s (a subclass override or an attribute set on the instance)."""
    method = getattr(obj, name, None)
    return method is not None and getattr(method, "__func__", method) is not getattr(base, name, None)


def defines_own(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj.<name>`` runs other code than ``base``'s, as Lightning decides it: a wrapper set
    on the instance stands for what it wraps (``functools.wraps`` / ``update_wrapper``'s
    ``__wrapped__``, a ``Mock(wraps=...)``, a ``functools.partial``), so a recorder around the base's
    hook is no override; a ``Mock`` wrapping nothing, or None, is none either."""
    own = getattr(obj, name, None)
    if own is None:
        return False
    own = getattr(own, "__wrapped__", own)
    if isinstance(own, Mock):
        own = own._mock_wraps
    elif isinstance(own, partial):
        own = own.func
    if own is None:
        return False
    inherited = getattr(base, name, None)
    if inherited is None:
        raise ValueError(f"{base.__name__} has no method {name!r} to override")
    inherited = getattr(inherited, "__wrapped__", inherited)
    return getattr(own, "__code__", own) is not getattr(inherited, "__code__", inherited)


def check_hooks(module: TrainModule, callbacks: list[Callback], datamodule: Any, strategy: Any) -> None:
    """Refuse, before any worker starts, a Lightning hook this trainer does not have, and a hook
    that cannot mean under ``strategy`` what it means in Lightning (one line naming both)."""
    from trainer.api.callback import Callback
    from trainer.api.datamodule import DataModule
    from trainer.api.module import TrainModule

    refuse_unknown_hooks(module, TrainModule, "TrainModule")
    if not getattr(strategy, "owns_step", False):
        return
    # The pipeline runs each micro-batch's forward and backward inside its schedule, stage by stage:
    # there is no per-micro-batch backward, loss or closure on a rank to hand to these hooks.
    owners = [(module, TrainModule)] + [(callback, Callback) for callback in callbacks]
    if datamodule is not None:
        owners.append((datamodule, DataModule))
    for owner, base in owners:
        for name in PER_MICRO_BATCH_HOOKS:
            if hasattr(base, name) and overrides(owner, base, name):
                raise ValueError(f"{type(owner).__name__}.{name}() cannot run under strategy={strategy.name}: the "
                                 "pipeline schedule runs each micro-batch's forward and backward itself, stage by "
                                 "stage; remove the override or use strategy=ddp / fsdp")
