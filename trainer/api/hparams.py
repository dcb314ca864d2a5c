"""``TrainModule.save_hyperparameters``: the module's init arguments, by name, as ``self.hparams``.

Captured like Lightning's: from the caller's frame (the user's ``__init__``; through a chain of
``super().__init__`` calls, the most derived class's values win). What is kept must survive a JSON
round trip (numbers, strings, bools, None and lists / dicts of them), because it is written to every
checkpoint's ``trainer_state.json`` (read by one process, without torch.distributed) and to every
logger. Anything else (a module, a dataset, an optimizer factory) is skipped with a warning that
names the key and says how to silence it (``ignore=[...]``), as Lightning does.

Secrets (keys such as ``api_key``, credentials in URLs; see ``trainer/runtime/redact.py``) are
redacted on disk and in loggers; the checkpoint records which keys were redacted, so that
``load_from_checkpoint`` asks for them again instead of restoring ``"***"``.
"""

from __future__ import annotations

import inspect
import logging
from types import FrameType
from typing import Any, Iterable, Mapping

from trainer.runtime.redact import redact_secrets

log = logging.getLogger(__name__)


class AttributeDict(dict):
    """A dict whose items are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"no hyperparameter {key!r}; saved: {sorted(self)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


def _is_plain(value: Any) -> bool:
    """Whether ``value`` survives JSON unchanged in meaning (tuples come back as lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def init_arguments(module: Any, frame: FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on the stack that build ``module``, starting at
    ``frame``: every named parameter and the contents of ``**kwargs`` (``*args`` has no names: skipped)."""
    found: list[dict[str, Any]] = []
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is module:
        code, local = frame.f_code, frame.f_locals
        count = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:count])
        values = {name: local[name] for name in names[1:] if name in local}  # names[0] is self
        flags = code.co_flags
        position = count
        if flags & inspect.CO_VARARGS:
            position += 1
        if flags & inspect.CO_VARKEYWORDS:
            extra = local.get(code.co_varnames[position], {})
            values.update(extra if isinstance(extra, Mapping) else {})
        found.append(values)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for values in found:  # innermost (base class) first: the derived classes' values win
        merged.update(values)
    return merged


def collect(module: Any, args: tuple, ignore: str | Iterable[str] | None, frame: FrameType | None) -> AttributeDict:
    """What ``save_hyperparameters(*args, ignore=...)`` keeps (see ``TrainModule.save_hyperparameters``)."""
    if len(args) == 1 and isinstance(args[0], Mapping):
        chosen = dict(args[0])
    else:
        available = init_arguments(module, frame) if frame is not None else {}
        if frame is None or (not available and frame.f_code.co_name != "__init__"):
            raise RuntimeError(
                "save_hyperparameters() must be called from the module's __init__ (it reads that call's arguments), "
                "or be given a dict of hyperparameters"
            )
        for name in args:
            if not isinstance(name, str):
                raise TypeError(f"save_hyperparameters: give argument names (str) or one dict, got {name!r}")
        unknown = [name for name in args if name not in available]
        if unknown:
            raise ValueError(f"save_hyperparameters: {unknown} are not arguments of {type(module).__name__}.__init__; "
                             f"its arguments are {sorted(available)}")
        chosen = {name: available[name] for name in args} if args else available
    ignored = [ignore] if isinstance(ignore, str) else list(ignore or ())
    unknown = [name for name in ignored if name not in chosen]
    if unknown:
        raise ValueError(f"save_hyperparameters(ignore={ignored}): {unknown} are not among the hyperparameters "
                         f"{sorted(chosen)}")
    kept = AttributeDict()
    for key, value in chosen.items():
        if key in ignored:
            continue
        if not _is_plain(value):
            log.warning(
                "save_hyperparameters: %r (a %s) is not saved: checkpoints and loggers keep only numbers, strings, "
                "bools, None and lists / dicts of them; load_from_checkpoint will need %s=... passed again. Silence "
                "this with save_hyperparameters(ignore=[%r])", key, type(value).__name__, key, key,
            )
            continue
        kept[key] = value
    return kept


def checkpoint_record(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint stores: the redacted hyperparameters and the keys whose values were redacted."""
    redacted = redact_secrets(dict(hparams))
    # (an unchanged value is the same object: a NaN is not mistaken for a redaction)
    changed = sorted(k for k in hparams if redacted[k] is not hparams[k] and redacted[k] != hparams[k])
    return {"values": redacted, "redacted": changed}


def for_loggers(config: Mapping[str, Any] | None, hparams: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the loggers' ``log_hyperparams`` gets: the run's config (Hydra) with the module's
    hyperparameters under ``"hparams"``, or the hyperparameters alone (a run from Python); None: nothing."""
    if config is None:
        return dict(hparams) if hparams else None
    if not hparams:
        return dict(config)
    return {**config, "hparams": dict(hparams)}
