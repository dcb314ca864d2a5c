"""Hyperparameters as people read them (loggers, ``hparams.yaml``, a checkpoint's ``trainer_state.json``).

Numbers, strings, bools and None stay as they are; mappings and sequences keep their shape; an
object becomes one line or block of text:

- a ``functools.partial``: ``functools.partial(torch.optim.AdamW, lr=0.001)``
- a class or function: its import path, ``torch.nn.ReLU`` (the shortest package path that exports it)
- an ``nn.Module``: its ``repr``, the layer tree torch prints
- anything else: its ``repr``

The text then goes through the secret redaction (``trainer/runtime/redact.py``), which reads
``api_key='...'`` inside such text too.
"""

from __future__ import annotations

import enum
import functools
import inspect
import sys
from typing import Any, Mapping

from trainer.api.hparams import is_json_exact
from trainer.runtime.redact import redact_secrets, secret_values


def import_path(obj: Any) -> str:
    """``package.Name`` for a class or function: the shortest enclosing package that exports the
    same object (``torch.optim.AdamW`` rather than ``torch.optim.adamw.AdamW``)."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return repr(obj)
    if module == "builtins":
        return name
    parts = module.split(".")
    if "." not in name:
        for end in range(1, len(parts)):
            package = sys.modules.get(".".join(parts[:end]))
            if package is not None and getattr(package, name, None) is obj:
                return f"{'.'.join(parts[:end])}.{name}"
    return f"{module}.{name}"


def describe(value: Any) -> str:
    """One object as text (see the module docstring)."""
    if isinstance(value, functools.partial):
        arguments = [describe(value.func)] + [_argument(a) for a in value.args]
        arguments += [f"{key}={_argument(v)}" for key, v in value.keywords.items()]
        return f"functools.partial({', '.join(arguments)})"
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
        return import_path(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not stop a run
        return f"<{import_path(type(value))}>"


def _argument(value: Any) -> str:
    return repr(value) if is_json_exact(value) else describe(value)


def readable(value: Any) -> Any:
    """``value`` with every object turned into text (mappings and sequences kept as dicts and lists)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, Mapping):
        return {str(key): readable(v) for key, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [readable(v) for v in value]
    if isinstance(value, enum.Enum):
        return describe(value)
    for plain in (bool, int, float, str):  # their subclasses (numpy's float64 is a float)
        if isinstance(value, plain):
            return plain(value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return readable(value.item())  # a numpy scalar
    return describe(value)


def _changed(before: Any, after: Any) -> bool:
    # (an unchanged value is the same object: a NaN is not mistaken for a redaction)
    return before is not after and before != after


def checkpoint_record(hparams: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """What a checkpoint's ``trainer_state.json`` stores of a module's (or datamodule's)
    hyperparameters: ``values`` (readable, redacted), ``redacted`` (the keys whose values held a
    secret: never stored, asked for again when loading), ``objects`` (the keys whose values are
    pickled in the checkpoint's ``hparams.pt``, since JSON would not give them back) and ``name``
    (the init argument the hyperparameters came in as one dict, if so: they are passed back under it)."""
    values: dict[str, Any] = {}
    redacted, objects = [], []
    shown_all = {key: readable(value) for key, value in hparams.items()}
    secrets = secret_values(shown_all)  # a secret-named key's value, repeated under another key, is a secret there too
    for key, value in hparams.items():
        shown = shown_all[key]
        clean = redact_secrets({key: shown}, secrets=secrets)[key]
        values[key] = clean
        if _changed(shown, clean):  # a secret-named key, or a secret inside the value's text
            redacted.append(key)
        elif not is_json_exact(value):
            objects.append(key)
    return {"values": values, "redacted": sorted(redacted), "objects": sorted(objects), "name": name}
