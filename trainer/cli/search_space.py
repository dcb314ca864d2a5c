"""A sweep's search space: Hydra's sweep overrides as Optuna distributions, and a trial's values back
as overrides.

| override | distribution |
| --- | --- |
| `key=a,b,c`, `key=choice(a,b,c)` | categorical over the values |
| `key=range(1,9,2)` | integers (or floats) 1, 3, 5, 7 (the stop is left out, as Python's `range`) |
| `key=interval(0.001,0.1)` | floats between the ends; `tag(log,interval(...))` on a log scale, `tag(int,interval(1,8))` integers |
| `key=value` | not searched: every trial gets it |

Optuna is imported by the functions that build distributions, never when this module is imported.
"""

from __future__ import annotations

import math
import re
from typing import Any

from trainer.cli.errors import SettingError

_TAGS = {"log", "int"}
_PLAIN = re.compile(r"[A-Za-z0-9_./:+-]+")


def split_overrides(overrides: list[Any], where: str) -> tuple[list[str], dict[str, Any]]:
    """Parsed overrides -> (the fixed ones as ``key=value`` strings, {key: Optuna distribution})."""
    fixed: list[str] = []
    space: dict[str, Any] = {}
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed.append(f"{key}={override.get_value_element_as_str()}")
            continue
        space[key] = distribution(key, override.value(), where)
    return fixed, space


def distribution(key: str, sweep: Any, where: str) -> Any:
    """One sweep (``ChoiceSweep`` / ``RangeSweep`` / ``IntervalSweep``) as an Optuna distribution."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    tags = set(sweep.tags)
    if tags - _TAGS:
        raise SettingError(f"{where} {key}: unknown tag(s) {', '.join(sorted(tags - _TAGS))}; "
                           f"the tags are log (a log scale) and int (integers), for interval()")
    if isinstance(sweep, ChoiceSweep):
        if tags:
            raise SettingError(f"{where} {key}: tags ({', '.join(sorted(tags))}) apply to interval() only")
        if len(sweep.list) < 1:
            raise SettingError(f"{where} {key}: choice() needs at least one value")
        return CategoricalDistribution([_choice_value(key, value, where) for value in sweep.list])
    if isinstance(sweep, RangeSweep):
        values = list(sweep.range())
        if not values:
            raise SettingError(f"{where} {key}: range({sweep.start},{sweep.stop},{sweep.step}) holds no value")
        if all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step)):
            return IntDistribution(int(values[0]), int(values[-1]), step=int(sweep.step), log="log" in tags)
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(sweep.step))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise SettingError(f"{where} {key}: interval({low},{high}) needs finite ends, the first below the second")
        if "log" in tags and low <= 0:
            raise SettingError(f"{where} {key}: tag(log, interval({low},{high})) needs ends above 0")
        if "int" in tags:
            return IntDistribution(int(low), int(high), log="log" in tags)
        return FloatDistribution(float(low), float(high), log="log" in tags)
    raise SettingError(f"{where} {key}: {type(sweep).__name__} cannot be searched; use choice(), range() or interval()")


def _choice_value(key: str, value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise SettingError(f"{where} {key}: choice value {value!r} is a {type(value).__name__}; Optuna chooses among "
                       f"numbers, strings, booleans and null")


def as_override(key: str, value: Any) -> str:
    """``key=value`` that Hydra parses back to ``value``."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"{key}={value!r}"
    text = str(value)
    if _PLAIN.fullmatch(text):
        return f"{key}={text}"
    return f"{key}='" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
