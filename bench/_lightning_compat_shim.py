"""Copied next to Lightning's rewritten tests by bench/lightning_compat.py (as ``_ltcompat_shim``).

A rewritten test file imports its module-level Lightning names through `lookup`: a name the mirror
has is the mirror's object; a name it lacks is a stand-in class that raises `Unavailable` (an
ImportError naming Lightning's path and the mirror's error) as soon as a test uses it. One missing
name then fails only the tests that use it, not every test of the file at collection.
"""

from __future__ import annotations

import importlib
from typing import Any

MARK = "[ltcompat-unavailable]"


class Unavailable(ImportError):
    """A Lightning name the mirror lacks was used (its message starts with `MARK`)."""


def _fail(cls: type) -> None:
    raise Unavailable(f"{MARK} {cls.lightning_name}: {cls.reason}")


class _Missing(type):
    """Metaclass of the stand-ins: calling, subclassing, reading an attribute or an isinstance check fails."""

    def __new__(mcs, name, bases, namespace, **kwargs):  # a class deriving from a stand-in
        _fail(next(base for base in bases if isinstance(base, _Missing)))

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _fail(cls)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _fail(cls)

    def __instancecheck__(cls, instance: Any) -> bool:
        _fail(cls)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        _fail(cls)


def lookup(module: str, name: str, lightning_name: str) -> Any:
    """``from module import name``, or a stand-in that fails when used."""
    try:
        target = importlib.import_module(module)
        try:
            return getattr(target, name)
        except AttributeError:
            return importlib.import_module(f"{module}.{name}")
    except (ImportError, AttributeError) as error:
        reason = f"{type(error).__name__}: {error}"
        stand_in = type.__new__(_Missing, name, (), {"lightning_name": lightning_name, "reason": reason})
        return stand_in


def mirror_setattr(monkeypatch: Any, path: str, name: str, value: Any) -> None:
    """A fixture's ``monkeypatch.setattr`` of a Lightning attribute, applied to the mirror's module or
    class at the rewritten ``path`` where the mirror has a public ``name`` there (else nothing)."""
    if name.startswith("_"):
        return
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except (AttributeError, ImportError):
            return
        if name in getattr(target, "__dict__", {}):
            monkeypatch.setattr(target, name, value)
        return
