"""Which submodules become their own unit: FSDP sharding units (and, later, activation
checkpointing regions). A unit is gathered, computed and freed on its own, so per-block units
are what makes full sharding save memory in forward and backward, not only in the optimizer.

Policies, combined:
- by class: the module's ``TrainModule.block_classes()`` or class names from the config;
- by size: ``min_num_params`` (a module whose parameters not already in a unit reach this count);
- ``"auto"``: the declared block classes, else the children of every ``ModuleList`` / ``ModuleDict``
  that hold parameters (the usual "layers" of a transformer).
The root is never in the list: the strategy makes it the last unit itself.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from torch import nn


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _class_names(root: nn.Module) -> set[str]:
    return {type(m).__name__ for m in root.modules() if m is not root and _num_params(m) > 0}


def _matches(module: nn.Module, names: set[str]) -> bool:
    cls = type(module)
    return cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names


def container_children(root: nn.Module) -> list[nn.Module]:
    """Children of ModuleList / ModuleDict containers that hold parameters."""
    found = []
    for module in root.modules():
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            found.extend(child for child in module.children() if _num_params(child) > 0)
    return found


def select_units(
    root: nn.Module,
    wrap: str | Sequence[str | type] = "auto",
    declared: Iterable[type] = (),
    min_num_params: int | None = None,
    option: str = "strategy.wrap",
) -> list[nn.Module]:
    """The submodules of ``root`` that become units, children before their parents (the order
    ``fully_shard`` needs). ``root`` itself is never included.

    Args:
        wrap: "auto", "none" (no class-based units) or a list of classes / class names (the bare
            ``Block`` or the qualified ``package.module.Block``).
        declared: the block classes the TrainModule declares (used by "auto").
        min_num_params: also make a unit of any module whose parameters outside units reach this.
        option: the config key named in error messages.
    """
    if isinstance(wrap, str) and wrap not in ("auto", "none"):
        wrap = [wrap]
    chosen: set[int] = set()
    if wrap == "auto":
        declared = tuple(declared)
        candidates = (
            [m for m in root.modules() if isinstance(m, declared)] if declared else container_children(root)
        )
        chosen |= {id(m) for m in candidates if m is not root}
    elif wrap != "none":
        classes = tuple(c for c in wrap if isinstance(c, type))
        names = {c for c in wrap if isinstance(c, str)}
        bad = [c for c in wrap if not isinstance(c, (str, type))]
        if bad:
            raise ValueError(f"{option}={list(wrap)!r}: entries must be class names; got {bad!r}")
        matched = [m for m in root.modules() if m is not root and (isinstance(m, classes) or _matches(m, names))]
        unmatched = sorted(n for n in names if not any(_matches(m, {n}) for m in matched))
        unmatched += [c.__name__ for c in classes if not any(isinstance(m, c) for m in matched)]
        if unmatched:
            raise ValueError(
                f"{option}: {unmatched} match no submodule of {type(root).__name__}; classes with parameters "
                f"in this model: {', '.join(sorted(_class_names(root)))}"
            )
        chosen |= {id(m) for m in matched}
    if min_num_params is not None:
        chosen |= _by_size(root, min_num_params, chosen)
    # Post-order (children first), each module once.
    ordered, seen = [], set()
    for module in _post_order(root):
        if id(module) in chosen and id(module) not in seen and module is not root:
            seen.add(id(module))
            ordered.append(module)
    return ordered


def _post_order(module: nn.Module) -> Iterable[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _by_size(root: nn.Module, min_num_params: int, already: set[int]) -> set[int]:
    """Post-order: a module becomes a unit when its parameters not inside a unit reach the minimum."""
    chosen: set[int] = set()

    def remaining(module: nn.Module) -> int:
        count = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            count += remaining(child)
        if module is not root and (id(module) in already or count >= min_num_params):
            if id(module) not in already:
                chosen.add(id(module))
            return 0
        return count

    remaining(root)
    return chosen


def describe_units(root: nn.Module, units: list[nn.Module]) -> str:
    """``"4 x Block (198,272 params each), root (33,024 params)"``: for the start-up log."""
    counts: dict[str, list[int]] = {}
    inside = set()
    for unit in units:
        own = [p for p in unit.parameters() if id(p) not in inside]
        inside |= {id(p) for p in own}
        counts.setdefault(type(unit).__name__, []).append(sum(p.numel() for p in own))
    root_params = sum(p.numel() for p in root.parameters() if id(p) not in inside)
    parts = [
        f"{len(sizes)} x {name} ({sizes[0]:,} params{' each' if len(set(sizes)) == 1 and len(sizes) > 1 else ''})"
        if len(set(sizes)) == 1 else f"{len(sizes)} x {name} ({sum(sizes):,} params)"
        for name, sizes in counts.items()
    ]
    return ", ".join(parts + [f"root ({root_params:,} params)"])


def leftover_units(root: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """Modules that make every parameter of ``root`` not in one of ``units`` part of a unit of its
    own: the topmost modules (below ``root``) that hold parameters directly, each with its subtree
    (a module using a child's weights in its own forward stays whole). Children before parents is
    kept: none of them contains another, and they go after ``units``."""
    taken = {id(p) for unit in units for p in unit.parameters()}
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if any(id(p) not in taken for p in module.parameters(recurse=False)):
            found.append(module)
            return
        for child in module.children():
            if any(id(p) not in taken for p in child.parameters()):
                visit(child)

    for child in root.children():
        if any(id(p) not in taken for p in child.parameters()):
            visit(child)
    return found


def own_parameters(root: nn.Module) -> list[str]:
    """Names of the parameters ``root`` holds itself (not through a submodule)."""
    return [name for name, _ in root.named_parameters(recurse=False)]
