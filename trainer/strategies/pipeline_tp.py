"""Tensor parallelism inside the pipeline's stages (``strategy=pipeline`` with ``tp > 1``).

The module's plan (``TrainModule.tensor_parallel_plan()``) is expanded over the whole model, then
cut by pipeline layer: a rank applies the entries of its own stages' layers, unit by unit (each
pipeline layer, or the children of a layer the module does not register), as the build
materialises the unit and before FSDP shards it (torchtitan's order); the entries of other
stages' layers are skipped. An entry outside every pipeline layer (a container of several layers,
the root) cannot be applied on one stage and is refused.

Stage boundaries carry plain tensors: the plan's styles hand their outputs on as local tensors
(``use_local_output=True``, the default), and each tensor-parallel rank sends its piece to the
same tensor-parallel coordinate of the next stage (trainer/strategies/pipeline_groups.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from trainer.strategies.tensor_parallel import apply_plan, expand_plan, module_plan, plan_under


def stage_plans(module: nn.Module, tp: int, layers: Sequence[nn.Module], my_layers: Sequence[nn.Module],
                units: Sequence[nn.Module]) -> dict[int, dict[str, Any]]:
    """``{id(unit): the plan entries inside that unit, renamed relative to it}`` for this rank's
    ``units`` (which cover ``my_layers``). ValueError (one line) when the module declares no plan
    or an entry lies outside every pipeline layer."""
    check = getattr(module, "check_tensor_parallel", None)
    if callable(check):
        check(tp)
    plan = module_plan(module)
    if plan is None:
        raise ValueError(f"strategy.tp={tp} needs {type(module).__name__}.tensor_parallel_plan() to say how to split "
                         "its layers (a dict {submodule name: ParallelStyle}); it returned None")
    expanded = expand_plan(module, plan)
    names = {id(m): n for n, m in module.named_modules()}
    layer_of = {names[id(m)]: i for i, layer in enumerate(layers) for m in layer.modules() if id(m) in names}
    mine = {i for i, layer in enumerate(layers) if any(layer is m for m in my_layers)}
    for name in expanded:
        if name not in layer_of:
            raise ValueError(f"{type(module).__name__}.tensor_parallel_plan() entry {name or '<root>'!r} is not inside "
                             "one of pipeline_layers(); under strategy=pipeline each entry must name a layer or a "
                             "submodule of one (a stage holds only its own layers)")
    kept = {name: style for name, style in expanded.items() if layer_of[name] in mine}
    return {id(unit): plan_under(kept, names[id(unit)]) for unit in units}


def parallelize_unit(unit: nn.Module, plan: dict[str, Any], tp_mesh: Any) -> None:
    """Apply ``plan`` (names relative to ``unit``; ``""`` is the unit itself) over ``tp_mesh``."""
    plan = dict(plan)
    own = plan.pop("", None)
    if own is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(unit, tp_mesh, own)
    apply_plan(unit, plan, tp_mesh)


def plain(value: Any) -> Any:
    """A DTensor metric (a loss under loss parallel) as a plain tensor of its full value, gradient
    kept; anything else unchanged."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def loss_parallel_context(enabled: bool) -> Any:
    """torch's ``loss_parallel()`` (cross-entropy on vocabulary-sharded logits) when ``enabled``."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()

