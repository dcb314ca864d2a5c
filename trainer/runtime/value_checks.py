"""The small checks every layer's argument validation is written with: ``is_int`` (an int, not a
bool) and ``require`` (a ValueError unless a condition holds)."""

from __future__ import annotations

from typing import Any


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require(condition: bool, message: str) -> None:
    """A ValueError with ``message`` unless ``condition``."""
    if not condition:
        raise ValueError(message)
