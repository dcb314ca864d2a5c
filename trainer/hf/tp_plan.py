"""A Hugging Face model's tensor-parallel plan as torch ParallelStyles.

transformers declares its plan as strings: ``config.base_model_tp_plan`` (names relative to the
base model, e.g. ``"layers.*.self_attn.q_proj": "colwise"``) and the task class's ``_tp_plan``
(relative to the task model, e.g. ``"lm_head": "colwise_gather_output"``). Each string here maps to
the torch style that computes the same thing; names get the wrapper's prefix (``model.`` and the
base model's attribute), so the trainer's ``tensor_parallel_plan()`` check sees real submodule names.
"""

from __future__ import annotations

from typing import Any, Callable


def _styles() -> dict[str, Callable[[], Any]]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        # the output stays split over the last dimension (heads, hidden units): the next rowwise layer takes it
        "colwise": ColwiseParallel,
        # the input split over its last dimension; the partial products summed: a replicated output
        "rowwise": RowwiseParallel,
        "rowwise_rep": RowwiseParallel,
        # split by columns, the output gathered (e.g. a vocabulary head whose logits the loss reads whole)
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        # an embedding's rows (vocabulary) split; the lookups summed into a replicated output
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        # an embedding's columns (width) split; the output gathered
        "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
    }


KNOWN = ("colwise", "rowwise", "rowwise_rep", "colwise_gather_output", "colwise_rep", "embedding_rowwise",
         "embedding_colwise", "sequence_parallel")


def to_styles(plan: dict[str, Any], prefix: str, owner: str) -> dict[str, Any]:
    """``plan`` (names -> transformers' style strings or torch ParallelStyles) with torch styles and
    ``prefix`` before each name. A string torch has no equivalent for here: one line naming it, the
    entry and the strings known, and saying to pass ``tp_plan=`` with torch styles instead."""
    from torch.distributed.tensor.parallel import ParallelStyle

    styles = _styles()
    converted = {}
    for name, style in plan.items():
        if isinstance(style, str):
            if style not in styles:
                raise ValueError(f"{owner}'s tensor-parallel plan maps {name!r} to {style!r}, which has no torch "
                                 f"ParallelStyle here (known: {', '.join(KNOWN)}); pass tp_plan={{name: "
                                 "ParallelStyle}} to give the plan yourself")
            style = styles[style]()
        elif not isinstance(style, ParallelStyle):
            raise ValueError(f"{owner}'s tensor-parallel plan maps {name!r} to {style!r}; give one of {', '.join(KNOWN)} "
                             "or a torch ParallelStyle")
        converted[prefix + name] = style
    return converted


def declared_plan(model_cls: type, config: Any, wrapper_attr: str) -> dict[str, str] | None:
    """The plan transformers declares for ``model_cls`` built from ``config``, names relative to the
    wrapper (``wrapper_attr`` is the attribute holding the model): the base model's
    ``base_model_tp_plan`` under its prefix, then the task class's own ``_tp_plan``. None when the
    config declares no base plan."""
    base = getattr(config, "base_model_tp_plan", None)
    if not base:
        return None
    base_prefix = getattr(model_cls, "base_model_prefix", "")
    head = getattr(model_cls, "_tp_plan", None) or {}
    inner = f"{wrapper_attr}.{base_prefix}." if base_prefix else f"{wrapper_attr}."
    plan = {inner + name: style for name, style in base.items()}
    plan.update({f"{wrapper_attr}.{name}": style for name, style in head.items()})
    return plan
