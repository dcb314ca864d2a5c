"""Cutting a module's ordered layers into pipeline stages (``strategy=pipeline``).

``partition_layers`` chooses the cut points (by layer count, by parameter count, or given),
``check_layers_cover_parameters`` refuses parameters a stage split would lose or duplicate, and
``Stage`` runs one contiguous run of layers as a module.
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

PARTITIONS = ("parameters", "uniform")


def partition_layers(sizes: Sequence[int], parts: int, how: str | Sequence[int]) -> list[int]:
    """Start index of each of ``parts`` contiguous pieces of ``len(sizes)`` layers (plus the end).

    ``how``: "uniform" (equal layer counts, the first pieces one longer), "parameters" (minimise
    the largest piece's parameter count), or the explicit start indices of pieces 1..parts-1.
    """
    n = len(sizes)
    if n < parts:
        raise ValueError(f"the module exposes {n} pipeline layers, fewer than the {parts} stages requested; "
                         "lower strategy.stages / strategy.virtual_stages or expose more layers")
    if not isinstance(how, str):
        cuts = list(how)
        if len(cuts) != parts - 1 or any(not isinstance(c, int) for c in cuts) or cuts != sorted(set(cuts)) \
                or (cuts and (cuts[0] <= 0 or cuts[-1] >= n)):
            raise ValueError(f"strategy.partition={list(how)!r}: give {parts - 1} increasing layer indices in "
                             f"1..{n - 1} (the first layer of each stage after the first)")
        return [0, *cuts, n]
    if how == "uniform":
        base, extra = divmod(n, parts)
        bounds = [0]
        for i in range(parts):
            bounds.append(bounds[-1] + base + (1 if i < extra else 0))
        return bounds
    if how != "parameters":
        raise ValueError(f"strategy.partition={how!r} is not one of {PARTITIONS} or a list of split indices")
    # Linear partition by dynamic programming: best[k][i] = smallest max-piece cost of the first i
    # layers in k pieces (every piece non-empty).
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds, i = [n], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    return bounds[::-1]


def check_layers_cover_parameters(module: nn.Module, layers: Sequence[nn.Module], bounds: list[int]) -> None:
    """Every parameter belongs to exactly one stage: one outside the layers would never be trained,
    one in two stages (tied weights) would be updated apart on two ranks."""
    names = {id(p): n for n, p in module.named_parameters()}
    names.update({id(b): n for n, b in module.named_buffers()})
    covered = {id(p) for layer in layers for p in layer.parameters()}
    outside = [n for n, p in module.named_parameters() if id(p) not in covered]
    if outside:
        raise ValueError(f"parameters {outside[:5]}{' ...' if len(outside) > 5 else ''} are in none of "
                         f"{type(module).__name__}.pipeline_layers(); every parameter must belong to a layer")
    stage_of: dict[int, int] = {}
    for stage in range(len(bounds) - 1):
        for layer in layers[bounds[stage]:bounds[stage + 1]]:
            for tensor in [*layer.parameters(), *layer.buffers()]:
                first = stage_of.setdefault(id(tensor), stage)
                if first != stage:
                    raise ValueError(
                        f"{names.get(id(tensor), 'a tensor')} is used by layers of pipeline stages {first} and {stage} "
                        "(tied weights?); tensors shared across stages are not supported: untie them or keep the "
                        "layers that share them in one stage (strategy.partition=[split indices])"
                    )


class Stage(nn.Module):
    """One pipeline stage: a contiguous run of the module's layers (the same objects, not copies)."""

    def __init__(self, layers: Sequence[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x
