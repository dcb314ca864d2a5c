"""``trainer dry-run [train.py's overrides] [dry_run.rank=R]``: check an N-D layout before renting it.

    trainer dry-run recipe=llama module.kv_heads=4 strategy=nd strategy.pp=4 strategy.dp_shard=4 strategy.tp=4 trainer.devices=64

Composes the config as ``train.py`` does (conf/dry_run.yaml = conf/config.yaml + the ``dry_run``
block) and checks it with train.py's checks; resolves the degrees of ``strategy=nd`` (or of
``strategy=pipeline`` with ``strategy.tp > 1``: stages x replicas x tp) (ParallelDims: one line when
they do not fit the world); then, in this one CPU process, lays out rank ``dry_run.rank`` of the world on
torch's fake process group with the module on the meta device (trainer/estimate/dry_run.py: this
rank's pipeline stage, the tensor-parallel plan over ``mesh["tp"]``, ``fully_shard`` over the
data-parallel dims) and prints its shards (parameter, global shape -> local shape, bytes,
placements) and its estimated memory (trainer/estimate/nd_plan.py). Nothing is allocated or trained.
"""

from __future__ import annotations

import math
import sys
import time
from functools import partial
from typing import Any, Sequence

from trainer.estimate.__main__ import compose as compose_config, run_tool
from trainer.runtime.value_checks import is_int

OPTIONS = ("rank", "device_memory_gb", "activations")


def compose(overrides: Sequence[str]) -> Any:
    """conf/dry_run.yaml with ``overrides``, as Hydra composes train.py's config."""
    return compose_config(overrides, "dry_run")


def check_options(options: dict) -> None:
    """The ``dry_run`` block: one line naming a bad value and what is allowed."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"dry_run.{unknown[0]} is not a dry-run setting; they are {', '.join(OPTIONS)}")
    rank = options.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"dry_run.rank={rank!r} must be a rank: an integer >= 0")
    memory_gb = options.get("device_memory_gb")
    if memory_gb is not None and (isinstance(memory_gb, bool) or not isinstance(memory_gb, (int, float)) or memory_gb <= 0):
        raise ValueError(f"dry_run.device_memory_gb={memory_gb!r} must be a positive number of GiB or null")
    if not isinstance(options.get("activations"), bool):
        raise ValueError(f"dry_run.activations={options.get('activations')!r} must be true or false")


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape)) or "scalar"


def shard_table(layout: Any, element_size: int) -> str:
    """One line per parameter of the rank: name, global shape -> local shape, bytes (as allocated), placements."""
    from trainer.estimate.table import _grid, human

    lines = [[s.name, _shape(s.global_shape), "->", _shape(s.local_shape), human(s.storage_numel * element_size),
              s.placements or "whole"] for s in layout.shards]
    return _grid(["parameter", "global shape", "", "local shape", "bytes", "placements"], lines, left_last=True)


def describe_rank(layout: Any) -> str:
    dims, c = layout.dims, layout.coordinates
    where = ", ".join(f"{n} {c[n]} of {getattr(dims, n)}" for n in c if getattr(dims, n) > 1) or "the only rank"
    line = f"rank {layout.rank} ({where})"
    if layout.stages:
        spans = ", ".join(f"stage {s} (layer{f' {a}' if a == b else f's {a}-{b}'})"
                          for s, (a, b) in zip(layout.stages, layout.stage_layers))
        line += f"; pipeline {spans} of {layout.dims.pp * len(layout.stages)} stages over {layout.layer_count} layers"
    return line


def dry_run(cfg: Any) -> str:
    """The printout for a composed config (see the module docstring)."""
    from hydra.utils import get_object, instantiate
    from omegaconf import OmegaConf

    from trainer.cli.hydra_app import check_config_keys, merge_precision
    from trainer.estimate.activations import example_batch, measure_for_precision
    from trainer.estimate.dry_run import rank_layout
    from trainer.estimate.model import build_fake, fake_mode, model_shapes
    from trainer.estimate.nd_plan import activation_bytes, layout_of, state_bytes
    from trainer.estimate.plan import Row, precision_bytes
    from trainer.estimate.table import configured_table, human

    started = time.perf_counter()
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    options = OmegaConf.to_container(cfg.pop("dry_run"))
    check_options(options)
    check_config_keys(cfg)
    node = OmegaConf.to_container(cfg.strategy)
    name = get_object(node.pop("_target_")).name
    devices, nodes = cfg.trainer.devices, cfg.trainer.num_nodes
    if not all(is_int(v) and v >= 1 for v in (devices, nodes)):
        raise ValueError(f"trainer.devices={devices!r} x trainer.num_nodes={nodes!r}: the dry run needs whole numbers "
                         "of processes (the world it lays out)")
    found = layout_of(name, node, devices * nodes)
    if found is None:
        raise ValueError(f"strategy={name}{' (tp 1)' if name == 'pipeline' else ''}: the dry run lays out strategy=nd "
                         "(degrees strategy.pp, dp_replicate, dp_shard, tp) and strategy=pipeline with strategy.tp > 1; "
                         "e.g. strategy=nd strategy.dp_shard=-1 strategy.tp=2 (trainer estimate counts the others)")
    dims, layout_args = found
    try:  # the layout is laid out either way; a strategy that cannot train it yet says so in the printout
        instantiate(cfg.strategy)
        refusal = None
    except Exception as error:  # Hydra wraps the strategy's ValueError: its one line is the cause's
        cause = error.__cause__ if isinstance(error.__cause__, ValueError) else None
        if cause is None and not isinstance(error, ValueError):
            raise
        refusal = str(cause or error)
    rank = options["rank"]
    make_module = partial(instantiate, cfg.module)
    layout = rank_layout(make_module, dims, rank, **layout_args)
    built_s = time.perf_counter() - started

    precision = merge_precision(cfg.trainer.get("precision"), instantiate(cfg.precision) if cfg.get("precision") else None)
    precision_name = getattr(precision, "name", "fp32")
    mode = fake_mode()
    module = build_fake(make_module, mode)
    shapes = model_shapes(module, mode)
    b = precision_bytes(shapes, precision_name, node)
    batch_size = cfg.data.get("batch_size") or 32
    checkpointing = bool(cfg.trainer.activation_checkpointing)
    acts, act_note = None, "activations not measured (dry_run.activations=false)"
    if options["activations"]:
        datamodule = instantiate(cfg.datamodule) if cfg.get("datamodule") is not None else None
        try:
            acts, gathered = measure_for_precision(module, mode, example_batch(module, batch_size, datamodule),
                                                   shapes.blocks, precision, pipeline=bool(shapes.layers))
            fsdp = dims.dp > 1 and layout_args.get("data_parallel", "fsdp") == "fsdp"
            acts = gathered if gathered is not None and fsdp else acts  # FSDP gathers in the compute dtype
            act_note = (f"activations: one micro-batch of {batch_size} measured on fake tensors"
                        f"{' with activation checkpointing' if checkpointing else ''}, divided by tp {dims.tp}"
                        + (", this stage's layers x the micro-batches in flight" if dims.pp > 1 else "")
                        + " (trainer/estimate/nd_plan.py)")
        except Exception as error:  # e.g. a manual-optimization step that needs a running Trainer
            act_note = f"activations not measured ({type(error).__name__}: {error})"
    unsharded = int(cfg.trainer.accumulate_grad_batches) > 1 and not node.get("sync_every_microbatch")
    bytes_ = state_bytes(layout, b, "full", unsharded)
    bytes_.activations = activation_bytes(layout, acts, checkpointing, node.get("microbatches"), node.get("schedule"))
    element = b.param  # the weights as held: bf16 under bf16-true, fp32 otherwise (mixed precision autocasts)
    total = sum(t.numel for t in shapes.parameters) * element
    held = sum(s.storage_numel for s in layout.shards) * element
    row = Row("nd", [bytes_])
    return "\n".join([
        f"dry run of {layout.module_name} on {dims.describe()}: torch's fake process group and the meta device, "
        f"nothing allocated ({built_s:.1f} s)",
        describe_rank(layout),
        *([f"note: training this layout is refused today: {refusal}"] if refusal else []),
        "",
        shard_table(layout, element),
        "",
        f"rank {rank} holds {len(layout.shards)} of the model's {len(shapes.parameters)} parameters: {human(held)} of "
        f"{human(total)} ({held / total:.1%}; 1 / {math.prod((dims.pp, dims.dp_shard, dims.tp))} would be "
        f"{human(total / (dims.pp * dims.dp_shard * dims.tp))}) in {precision_name}",
        "",
        f"estimated memory of rank {rank} ({act_note}):",
        configured_table(row, options.get("device_memory_gb"), "rank", measured=acts is not None, first=rank),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(sys.argv[1:] if argv is None else argv, __doc__, lambda args: dry_run(compose(args)))


if __name__ == "__main__":
    from trainer.cli.project_dir import use_project_dir

    use_project_dir()
    sys.exit(main())
