"""The optimizer's and the schedule's settings, checked by their own constructors before any worker starts.

A module builds its optimizer from the ``optimizer`` group inside every worker, at the start of
``fit``: a setting torch refuses there (``optimizer.lr=-1``, ``betas`` outside [0, 1), a negative
``weight_decay``) would end each rank with a traceback after the processes started. Instead the
process that reads the config builds each optimizer once on a small dummy parameter, and the
``scheduler`` group's schedule on that optimizer, so that the constructors' own checks (not a
list of rules kept here) run up front. A refusal becomes one ``ValueError`` naming the setting, its
value, the constructor's reason and the constructor's default for it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator

import torch

from trainer.cli.hydra_errors import import_target

_HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")


def check_optimizer_settings(config: dict) -> None:
    """Build every optimizer factory of the resolved ``config`` (a ``_partial_`` node whose
    ``_target_`` is a ``torch.optim.Optimizer``) and the ``scheduler`` factory on the top-level one;
    raise ``ValueError`` naming the setting the constructor refuses."""
    checked: list[dict] = []
    top_level = None
    for where, node in _optimizer_nodes(config):
        if node in checked:  # ${optimizer} copied into the module's node: said once, by its own name
            continue
        checked.append(node)
        optimizer = _build(where, node, lambda factory: factory([_dummy_parameter()]), (ValueError, TypeError))
        if where == "optimizer":
            top_level = optimizer
    scheduler = config.get("scheduler")
    if top_level is not None and _is_factory(scheduler):
        # A schedule's constructor may want arguments a module passes itself: only its ValueErrors count.
        _build("scheduler", scheduler, lambda factory: factory(top_level), (ValueError,))


def _dummy_parameter() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.zeros(2, 2))  # 2-D: some optimizers (Muon) take matrices only


def _is_factory(node: Any) -> bool:
    return isinstance(node, dict) and isinstance(node.get("_target_"), str) and bool(node.get("_partial_"))


def _optimizer_nodes(config: Any, where: str = "") -> Iterator[tuple[str, dict]]:
    """``(dotted path, node)`` of the optimizer factories, the top-level ``optimizer`` first."""
    if not isinstance(config, dict):
        return
    names = sorted(config, key=lambda name: name != "optimizer") if not where else list(config)
    for name in names:
        node = config[name]
        path = f"{where}.{name}" if where else str(name)
        if _is_factory(node) and _is_optimizer_class(node["_target_"]):
            yield path, node
        elif isinstance(node, dict):
            yield from _optimizer_nodes(node, path)


def _is_optimizer_class(target: str) -> bool:
    try:
        found = import_target("", target)
    except ValueError:  # a target that does not import: building the module will say so
        return False
    return inspect.isclass(found) and issubclass(found, torch.optim.Optimizer)


def _build(where: str, node: dict, call: Callable[[Any], Any], refusals: tuple[type, ...]) -> Any:
    """``call(instantiate(node))``; a refusal (one of ``refusals``) as a ``ValueError`` naming the
    setting that causes it: the one whose removal (the constructor's default instead) is accepted."""
    from hydra.utils import instantiate

    try:
        return call(instantiate(node))
    except refusals as error:
        reason = " ".join(str(error).split())
        target = node["_target_"]
        for key in (k for k in node if k not in _HYDRA_KEYS):
            try:
                call(instantiate({k: v for k, v in node.items() if k != key}))
            except Exception:  # not this setting alone
                continue
            default = _default(target, key)
            allowed = f"; the default is {key}={_shown(default)}" if default is not inspect.Parameter.empty else ""
            raise ValueError(f"{where}.{key}={_shown(node[key])}: {target} refuses it ({reason}){allowed}") from None
        settings = ", ".join(f"{k}={_shown(v)}" for k, v in node.items() if k not in _HYDRA_KEYS)
        raise ValueError(f"{where}: {target}({settings}) refuses these settings ({reason})") from None


def _default(target: str, key: str) -> Any:
    try:
        parameter = inspect.signature(import_target("", target)).parameters.get(key)
    except (TypeError, ValueError):
        return inspect.Parameter.empty
    return parameter.default if parameter is not None else inspect.Parameter.empty


def _shown(value: Any) -> str:
    """A value as one would type it in an override."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)
