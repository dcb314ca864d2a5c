"""Checks of single JSON values, with errors that name the DeepSpeed key."""

from __future__ import annotations

import numbers
from typing import Any


def block(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` as a dict (``{}`` when omitted); an error naming the key otherwise."""
    value = data.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"deepspeed_config: {key} must be a JSON object, got {value!r}")
    return value


def flag(node: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = node.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"deepspeed_config: {where}.{key} must be true or false, got {value!r}")
    return value


def integer(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:
        ok = False
    if ok and maximum is not None and value > maximum:
        ok = False
    if not ok:
        bounds = f" >= {minimum}" if maximum is None else f" in [{minimum}, {maximum}]"
        raise ValueError(f"deepspeed_config: {name} must be an integer{bounds if minimum is not None else ''}, got {value!r}")
    return int(value)


def number(value: Any, name: str, minimum: float | None = None, strictly: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok and minimum is not None:
        ok = value > minimum if strictly else value >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strictly else '>='} {minimum:g}"
        raise ValueError(f"deepspeed_config: {name} must be a number{bound}, got {value!r}")
    return float(value)
