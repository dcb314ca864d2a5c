"""Module hooks that pass an argument where Lightning's hook of the same name takes none.

``on_train_epoch_end(epoch)`` and ``on_validation_end(metrics)`` give the module the epoch and the
reduced metrics; a LightningModule overrides them as ``on_train_epoch_end(self)`` and
``on_validation_end(self)``. Both shapes are honoured: an override that cannot take the argument
but takes none is called without it (reading ``self.current_epoch`` / ``self.trainer.callback_metrics``
as in Lightning). Any other mismatch raises Python's own TypeError at the call.
"""

from __future__ import annotations

import inspect
from typing import Any

_NO_ARGUMENT: dict[tuple[type, str], bool] = {}


def call_module_hook(module: Any, hook: str, *args: Any) -> Any:
    """``module.<hook>(*args)``, or ``module.<hook>()`` for an override of Lightning's shape."""
    method = getattr(module, hook)
    key = (type(module), hook)
    if key not in _NO_ARGUMENT:
        _NO_ARGUMENT[key] = bool(args) and _binds(method) and not _binds(method, *args)
    return method() if _NO_ARGUMENT[key] else method(*args)


def _binds(method: Any, *args: Any) -> bool:
    try:
        inspect.signature(method).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature to read: called as given
        return not args
    return True


_TAKES_BATCH_IDX: dict[Any, bool] = {}


def call_step(module: Any, name: str, batch: Any, batch_idx: int, *dataloader_idx: int) -> Any:
    """``module.<name>(batch, batch_idx)`` (``training_step``, ``validation_step`` ...), or
    ``module.<name>(batch)`` for a step written without ``batch_idx`` (Lightning passes it only
    where the signature has room for it); with several evaluation loaders
    ``module.<name>(batch, batch_idx, dataloader_idx)``."""
    method = getattr(module, name)
    if dataloader_idx:
        return method(batch, batch_idx, *dataloader_idx)
    key = getattr(method, "__func__", method)
    takes = _TAKES_BATCH_IDX.get(key)
    if takes is None:
        takes = _TAKES_BATCH_IDX[key] = _binds(method, batch, batch_idx) or not _binds(method, batch)
    return method(batch, batch_idx) if takes else method(batch)


def require_dataloader_idx(module: Any, name: str, stage_loader: str, count: int) -> None:
    """With several evaluation loaders the step gets ``dataloader_idx``: a step with no room for it is an
    error naming it (Lightning's, a RuntimeError), before any batch runs."""
    method = getattr(module, name, None)
    if method is not None and not _binds(method, None, 0, 0):
        raise RuntimeError(f"You provided multiple `{stage_loader}` ({count} loaders), but no `dataloader_idx` argument "
                           f"in `{type(module).__name__}.{name}()`. Try adding `dataloader_idx=0` to its signature.")


def call_with_stage(method: Any, *args: Any) -> Any:
    """``setup`` / ``teardown``: ``method(*args[:-1], stage=args[-1])`` as Lightning calls them when
    ``method`` takes a ``stage`` keyword, else the stage positionally (an override naming it otherwise)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: called as given
        return method(*args)
    keyword = any(p.kind is p.VAR_KEYWORD or (p.name == "stage" and p.kind is not p.POSITIONAL_ONLY) for p in parameters)
    return method(*args[:-1], stage=args[-1]) if keyword else method(*args)
