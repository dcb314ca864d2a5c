"""A module's tensor-parallel plan: read, checked against the model, expanded, applied.

A TrainModule declares its plan with ``tensor_parallel_plan()``: ``{submodule name: ParallelStyle}``
(``torch.distributed.tensor.parallel``'s ``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``PrepareModuleInput`` ...), names relative to the TrainModule, ``*`` matching
any one name segment (``"model.blocks.*.attention.q"``). Torch's ``parallelize_module`` only warns
about a name that matches nothing; here such a plan is refused, naming the key.

The plan is expanded to concrete names once (`expand_plan`), so it can be applied to the
whole model at once (eager builds) or one unit at a time as a meta-device build materialises it
(`plan_under`, then `apply_plan` on the unit; what no unit holds goes to the root last).
"""

from __future__ import annotations

import difflib
from fnmatch import fnmatchcase
from typing import Any

from torch import nn


def module_plan(module: nn.Module) -> dict[str, Any] | None:
    """The module's declared plan (``tensor_parallel_plan()``), checked for shape; None: it declares none."""
    hook = getattr(module, "tensor_parallel_plan", None)
    plan = hook() if callable(hook) else None
    if plan is None:
        return None
    from torch.distributed.tensor.parallel import ParallelStyle

    if not isinstance(plan, dict):
        raise ValueError(f"{type(module).__name__}.tensor_parallel_plan() returned {type(plan).__name__}; "
                         "return a dict {submodule name: ParallelStyle} or None")
    for key, style in plan.items():
        if not isinstance(key, str) or not isinstance(style, ParallelStyle):
            raise ValueError(f"{type(module).__name__}.tensor_parallel_plan(): entry {key!r}: {style!r} must map a "
                             "submodule name (str) to a ParallelStyle (ColwiseParallel(), RowwiseParallel(), ...)")
    return plan


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatchcase(n, p) for p, n in zip(parts, names))


def expand_plan(module: nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with every key replaced by the submodule names it matches, in ``named_modules()``
    order. ValueError, naming the key and the closest names, for a key that matches nothing or a
    submodule two keys claim."""
    names = [name for name, _ in module.named_modules() if name]
    expanded: dict[str, Any] = {}
    claimed: dict[str, str] = {}
    for key, style in plan.items():
        found = [name for name in names if _matches(key, name)] if key else [""]
        if not found:
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; its submodules include {', '.join(names[:6])}"
            raise ValueError(f"{type(module).__name__}.tensor_parallel_plan() names {key!r}, which is no submodule of "
                             f"the model{hint}")
        for name in found:
            if name in claimed:
                raise ValueError(f"{type(module).__name__}.tensor_parallel_plan(): {name!r} is matched by both "
                                 f"{claimed[name]!r} and {key!r}; give each submodule one style")
            claimed[name] = key
            expanded[name] = style
    return {name: expanded[name] for name in [""] + names if name in expanded}


def plan_under(plan: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entries of an expanded plan inside submodule ``prefix``, renamed relative to it."""
    if not prefix:
        return dict(plan)
    inside = {}
    for name, style in plan.items():
        if name == prefix:
            inside[""] = style
        elif name.startswith(prefix + "."):
            inside[name[len(prefix) + 1:]] = style
    return inside


def apply_plan(module: nn.Module, plan: dict[str, Any], tp_mesh: Any) -> None:
    """Apply an expanded plan (names relative to ``module``) over the 1-D tensor-parallel mesh."""
    if not plan:
        return
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(module, tp_mesh, plan)
