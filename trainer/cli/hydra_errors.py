"""Hydra's errors while it composes the config, said in one line with the valid names, closest first.

Hydra reports a mistyped group option, key or override in several lines, and for a mistyped key it
suggests adding it with ``+`` (which would only move the error, or hide the typo). `describe`
turns those errors into one line that names what was typed and what is allowed:

- ``strategy=fdsp``: the group's options (``did you mean strategy=fsdp?``);
- ``trainer.max_step=10``: the node's keys (``did you mean trainer.max_steps=10?``);
- ``devices=2``: the keys of that name deeper in the config (``did you mean trainer.devices=2?``);
- ``strategy=ddp strategy.sharding=full``: the options of the group that have the key;
- ``trainer.max_steps=[1``: an override that parses, where closing a bracket or a quote gives one;
- ``logger=jsonl,csv``: a sweep without ``--multirun``: the list and the text it may have meant.

`import_target` does the same for a ``_target_`` that does not import.

Any other error Hydra raises while composing is joined into one line as it is.
"""

from __future__ import annotations

import difflib
import pkgutil
import re
from typing import Any

# Keys Hydra reads itself: never suggested.
_HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
_VALUE_SYNTAX = "an override is name=value, the value a number, a word, 'quoted text', [a,b] or {k:v}"


def closest_first(name: str, choices: list[str]) -> list[str]:
    """``choices`` with the ones close to ``name`` first (closest first), then the rest in order."""
    close = difflib.get_close_matches(name, choices, n=len(choices), cutoff=0.6)
    return close + [choice for choice in choices if choice not in close]


def did_you_mean(prefix: str, name: str, choices: list[str]) -> str:
    """``" (did you mean <prefix>.<closest>?)"``, or nothing when no choice is close to ``name``."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return f" (did you mean {prefix}.{close[0]}?)" if close else ""


def describe(error: BaseException) -> str | None:
    """One line for an error Hydra raised while composing the config; None for any other error."""
    from hydra.errors import CompactHydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(error, MissingConfigException):
        return _missing_option(error)
    if isinstance(error, OverrideParseException):
        return _bad_syntax(error)
    cause = error.__cause__
    if (isinstance(error, CompactHydraException) and isinstance(cause, (ConfigAttributeError, ConfigKeyError))
            and getattr(cause, "parent_node", None) is not None and getattr(cause, "key", None) is not None):
        return _unknown_key(error, cause)
    sweep = re.match(r"(?:Ambiguous value for argument|Sweep parameters) '([^']*)'", str(error))
    if isinstance(error, CompactHydraException) and sweep:
        return _sweep_without_multirun(sweep.group(1))
    if isinstance(error, CompactHydraException):
        text = str(error)
        if isinstance(cause, OmegaConfBaseException):
            text += "; " + str(cause).splitlines()[0]
        return " ".join(text.split())
    return None


# ----- a group option that does not exist --------------------------------------------------------------
def _missing_option(error: Any) -> str:
    missing = str(error.missing_cfg_file)
    group, _, option = missing.rpartition("/")
    options = list(error.options or _group_options(group))
    # The defaults list that names it: the primary one (also for a command-line choice) or a recipe's own.
    asked_by = re.match(r"In '([^']+)'", str(error))
    asked_by = asked_by.group(1) if asked_by and asked_by.group(1) not in ("config", "hydra/config") else None
    where = f" (asked for by {asked_by})" if asked_by else ""
    if not group:  # the primary config (--config-name)
        configs = [name for name in _group_options("") if not name.startswith("_")]  # not Hydra's own
        return (f"--config-name={option}: there is no config {option}{where}; "
                f"the configs are {', '.join(closest_first(option, configs))}")
    if not options:
        groups = [g for g in _groups() if g != "hydra"]
        return (f"{group}={option}: there is no config group {group}{where}; "
                f"the groups are {', '.join(closest_first(group, groups))}")
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
    hint = f"; did you mean {group}={close[0]}?" if close else ""
    return (f"{group}={option}: there is no {group} option {option}{where}{hint} "
            f"(the {group} options are {', '.join(closest_first(option, options))})")


# ----- a key that does not exist ----------------------------------------------------------------------
def _unknown_key(error: BaseException, cause: Any) -> str:
    from omegaconf import OmegaConf

    key, full_key = str(cause.key), str(cause.full_key)
    typed = re.search(r"use \+(.+)$", str(error), re.MULTILINE)  # "To append to your config use +a.b=v"
    override = typed.group(1).strip() if typed else full_key
    value = override.split("=", 1)[1] if "=" in override else None
    tail = f"={value}" if value is not None else ""
    node = OmegaConf.to_container(cause.parent_node, resolve=False)
    keys = [str(k) for k in node if k not in _HYDRA_KEYS and k != "hydra"]
    prefix = full_key[: -len(key)].rstrip(".") if full_key.endswith(key) else full_key.rpartition(".")[0]
    if not prefix:
        return _unknown_top_level_key(override, key, tail, node, keys)

    arguments = _target_arguments(node.get("_target_")) if isinstance(node, dict) else []
    if key in arguments:  # the class takes it; the yaml does not list it
        return (f"{override}: {prefix}.{key} is a setting of {node['_target_']} that this config does not list; "
                f"add it with +{override}")
    settable = keys + [name for name in arguments if name not in keys]
    group, _, rest = full_key.partition(".")
    selected, holders = _group_holders(group, rest, node) if group in _groups() else (None, [])
    where = f"{group}={selected}" if selected and prefix == group else prefix
    message = f"{override}: {where} has no key {key}"
    if holders:
        message += f" ({' and '.join(f'{group}={h}' for h in holders)} has it: select that {group} to set it)"
    close = difflib.get_close_matches(key, settable, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {prefix}.{close[0]}{tail}?"
    return message + f" (the keys of {where}: {', '.join(closest_first(key, settable))})"


def _unknown_top_level_key(override: str, key: str, tail: str, root: dict, keys: list[str]) -> str:
    """``devices=2``: the keys called ``devices`` deeper down first, then close top-level names."""
    groups = [g for g in _groups() if g != "hydra" and g not in keys]
    paths = _paths(root)
    suggestions = [path for path in paths if path.rsplit(".", 1)[-1] == key]
    suggestions += difflib.get_close_matches(key, keys + groups, n=2, cutoff=0.6)
    names = {path.rsplit(".", 1)[-1] for path in paths}
    close_names = set(difflib.get_close_matches(key, sorted(names), n=2, cutoff=0.75))
    suggestions += [path for path in paths if path.rsplit(".", 1)[-1] in close_names]
    suggestions = list(dict.fromkeys(suggestions))[:3]
    message = f"{override}: there is no top-level key {key}"
    if suggestions:
        message += "; did you mean " + " or ".join(f"{s}{tail}" for s in suggestions) + "?"
    return message + (f" (the top-level keys: {', '.join(keys)}"
                      + (f"; the config groups: {', '.join(groups)}" if groups else "") + ")")


def _paths(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key below the top level of a plain config (``trainer.devices``, ...)."""
    paths: list[str] = []
    if not isinstance(node, dict):
        return paths
    for name, child in node.items():
        if name == "hydra" or str(name).startswith("_"):
            continue
        path = f"{prefix}.{name}" if prefix else str(name)
        if prefix:
            paths.append(path)
        paths += _paths(child, path)
    return paths


def _target_arguments(target: Any) -> list[str]:
    """The keyword arguments ``_target_`` takes (none if it cannot be imported or inspected)."""
    import inspect

    if not isinstance(target, str):
        return []
    try:
        parameters = inspect.signature(import_target("", target)).parameters
    except Exception:  # a target that does not import, or has no signature: nothing to suggest
        return []
    return [name for name, p in parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# ----- the config groups, through the search path of the running Hydra ---------------------------------
def _loader() -> Any:
    from hydra.core.global_hydra import GlobalHydra

    instance = GlobalHydra.instance()
    return instance.config_loader() if instance.is_initialized() else None


def _groups() -> list[str]:
    loader = _loader()
    return sorted(loader.list_groups("")) if loader is not None else []


def _group_options(group: str) -> list[str]:
    loader = _loader()
    return sorted(loader.get_group_options(group)) if loader is not None else []


def _group_holders(group: str, rest: str, node: dict) -> tuple[str | None, list[str]]:
    """The option of ``group`` that built ``node`` (by its ``_target_``) and the others that have
    the key ``rest``."""
    from omegaconf import OmegaConf

    loader = _loader()
    selected, holders = None, []
    for option in _group_options(group):
        path = f"{group}/{option}"
        result = next((source.load_config(path) for source in loader.get_sources() if source.is_config(path)), None)
        if result is None or result.header.get("package") not in (None, "", "_group_"):
            continue
        config = OmegaConf.to_container(result.config, resolve=False)
        if isinstance(config, dict) and "_target_" in node and config.get("_target_") == node["_target_"]:
            selected = option
        elif _has_path(config, rest):
            holders.append(option)
    return selected, holders


def _has_path(config: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


# ----- a sweep, or a list without its brackets -------------------------------------------------------------
def _close_ignoring_case(name: str, names: list[str], n: int) -> list[str]:
    """The ``n`` names closest to ``name`` (``Adamw`` finds ``AdamW`` first)."""
    by_lower: dict[str, str] = {}
    for candidate in names:
        by_lower.setdefault(candidate.lower(), candidate)
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)]


def _sweep_without_multirun(override: str) -> str:
    key, _, value = override.partition("=")
    quote = '"' if "'" in value else "'"
    return (f"{override}: a comma-separated value is a sweep, which runs with --multirun (-m); "
            f"for a list write {key}=[{value}], for text {key}={quote}{value}{quote}")


# ----- a _target_ that does not import --------------------------------------------------------------------
def import_target(where: str, target: str) -> Any:
    """The object a ``_target_`` names (as Hydra finds it, without its error log); a ``ValueError`` in
    one line if it does not import: the names close to the missing one in the deepest module of
    its path that does import. A module that raises something else while importing (a bug in it)
    raises that, with its traceback."""
    import importlib

    parts = str(target).split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and not name.startswith(error.name):  # the module imports a missing one
                raise ValueError(f"{where}._target_={target}: importing {name} failed ({error})") from None
            continue
        for depth, attribute in enumerate(parts[cut:]):
            if not hasattr(found, attribute):
                owner = ".".join(parts[:cut + depth])
                names = [n for n in dir(found) if not n.startswith("_")]
                if hasattr(found, "__path__"):  # a package: its modules too, imported or not
                    names += [m.name for m in pkgutil.iter_modules(found.__path__) if m.name not in names]
                close = [f"{owner}.{n}" for n in _close_ignoring_case(attribute, names, 3)]
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ValueError(f"{where}._target_={target}: {owner} has no {attribute}{hint}")
            found = getattr(found, attribute)
        return found
    raise ValueError(f"{where}._target_={target}: there is no module {parts[0]}; give a class or function "
                     "as package.module.Name")


# ----- an override that does not parse ----------------------------------------------------------------
def _bad_syntax(error: Any) -> str:
    override = str(getattr(error, "override", "") or "")
    reason = " ".join(str(getattr(error, "message", "") or error).split("\nSee ")[0].split())
    reason = reason.replace(f"Error parsing override '{override}' ", "")  # the override is said first already
    fix = _repair(override) if override else None
    return (f"{override}: not a valid override ({reason})" + (f"; did you mean {fix}?" if fix else "")
            + f" ({_VALUE_SYNTAX})")


def _repair(override: str) -> str | None:
    """The first of a few likely fixes that Hydra parses: close the open brackets, close a quote,
    or quote the whole value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, equals, value = override.partition("=")
    if not equals or not value:
        return None
    closers: list[str] = []
    for char in value:
        if char in "[{":
            closers.append("]" if char == "[" else "}")
        elif closers and char == closers[-1]:
            closers.pop()
    candidates = []
    if closers:
        candidates.append(override + "".join(reversed(closers)))
    if value[0] in "'\"" and not value.endswith(value[0]):
        candidates.append(override + value[0])
    quote = '"' if "'" in value else "'"
    candidates.append(f"{key}={quote}{value}{quote}")
    parser = OverridesParser.create()
    for candidate in candidates:
        try:
            parser.parse_override(candidate)
        except Exception:  # not this one
            continue
        return candidate
    return None
