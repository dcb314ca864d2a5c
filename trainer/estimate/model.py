"""The module built without memory, and the shapes the formulas need from it.

``build_fake`` instantiates the module (its ``__init__`` and ``configure_model``) under
``FakeTensorMode``: every tensor is a fake one on meta storage (no bytes allocated; the device
reads as CPU so that autocast behaves as in training). ``ModelShapes`` then reads, from the
built module: every parameter's shape, the optimizer's param groups (``configure_optimizers``,
as the trainer builds them), the FSDP units (``trainer/wrap_policy.select_units``, as the
strategy chooses them) and the pipeline layers with their stage cut
(``pipeline_partition.partition_layers``, as the strategy cuts them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from trainer.estimate.formulas import TensorShape


def fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def build_fake(make_module: Callable[[], nn.Module], mode: Any) -> nn.Module:
    """``make_module()`` and its ``configure_model()`` under the fake ``mode`` (no memory used)."""
    with mode:
        module = make_module()
        if hasattr(module, "configure_model"):
            module.configure_model()
    return module


def shape_of(parameter: nn.Parameter) -> TensorShape:
    return TensorShape(tuple(parameter.shape), parameter.requires_grad)


@dataclass
class ModelShapes:
    """What the formulas read from a built module."""

    parameters: list[TensorShape]
    groups: list[list[TensorShape]]  # the optimizers' param groups (ZeRO-1 assigns within them)
    optimizer_factories: list[Callable[..., torch.optim.Optimizer]]  # one per optimizer (manual optimization: several)
    blocks: list[nn.Module]  # block_classes() instances (activation checkpointing's regions)
    layers: list[list[TensorShape]] | None  # pipeline_layers(), None without them

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.parameters)

    def fsdp_units(self, module: nn.Module, wrap: Any = "auto", min_num_params: int | None = None) -> list[list[TensorShape]]:
        """Parameters of each FSDP unit, as FSDPStrategy.wrap picks them; the root's remainder last."""
        from trainer.strategies.wrap_policy import select_units

        declared = module.block_classes() if hasattr(module, "block_classes") else ()
        units = select_units(module, wrap, declared, min_num_params)
        inside: set[int] = set()
        shapes = []
        for unit in units:  # children before parents: a parent's unit holds what its children do not
            own = [p for p in unit.parameters() if id(p) not in inside]
            inside |= {id(p) for p in own}
            shapes.append([shape_of(p) for p in own])
        shapes.append([shape_of(p) for p in module.parameters() if id(p) not in inside])
        return shapes


def _collect_optimizers(configured: Any) -> list[torch.optim.Optimizer]:
    """Every optimizer in what ``configure_optimizers`` returned (any of its shapes: an optimizer,
    ``(optimizer, scheduler)``, lists of them, dicts with an "optimizer" key)."""
    if isinstance(configured, torch.optim.Optimizer):
        return [configured]
    if isinstance(configured, dict):
        return _collect_optimizers(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)):
        return [o for item in configured for o in _collect_optimizers(item)]
    return []


def optimizers_of(module: nn.Module, mode: Any) -> tuple[list[list[nn.Parameter]], list[Callable[..., Any]]]:
    """The param groups of every optimizer ``module.configure_optimizers()`` builds (on the fake
    parameters: no state exists before a step), and a factory of each."""
    with mode:
        configured = module.configure_optimizers()
    optimizers = _collect_optimizers(configured)
    if not optimizers:
        raise ValueError(f"{type(module).__name__}.configure_optimizers() gave {type(configured).__name__}, "
                         "no optimizer to estimate the state of")
    factories = []
    for optimizer in optimizers:
        # As ZeRO-1 rebuilds it (trainer/strategies/ddp.py): the class with the defaults it takes.
        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        factories.append(lambda params, cls=type(optimizer), kw=defaults: cls(params, **kw))
    return [list(g["params"]) for o in optimizers for g in o.param_groups], factories


def model_shapes(module: nn.Module, mode: Any) -> ModelShapes:
    from trainer.strategies.wrap_policy import select_units

    groups, factories = optimizers_of(module, mode)
    declared = module.block_classes() if hasattr(module, "block_classes") else ()
    blocks = select_units(module, "auto", declared) if declared else []
    layers = module.pipeline_layers() if hasattr(module, "pipeline_layers") else None
    return ModelShapes(
        parameters=[shape_of(p) for p in module.parameters()],
        groups=[[shape_of(p) for p in group] for group in groups],
        optimizer_factories=factories,
        blocks=blocks,
        layers=[[shape_of(p) for p in layer.parameters()] for layer in layers] if layers else None,
    )


def stage_bounds(layers: Sequence[Sequence[TensorShape]], parts: int, partition: Any) -> list[int]:
    """Each stage's first layer (and the end), as PipelineStrategy cuts them."""
    from trainer.strategies.pipeline_partition import partition_layers

    return partition_layers([sum(t.numel for t in layer) for layer in layers], parts, partition)
