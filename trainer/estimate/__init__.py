"""Memory estimator: per-rank bytes of a config's training before any hardware is rented.

``python -m trainer.estimate recipe=gpt module.layers=48 module.width=2048 trainer.devices=8
trainer.num_nodes=4 estimate.device_memory_gb=80`` prints the configured strategy per rank and a
table of single / DDP / ZeRO-1 / FSDP grad_op, full, hybrid (and full with CPU offload) / pipeline /
pipeline x FSDP (and, for a module with a tensor-parallel plan, FSDP x TP and pp x FSDP x TP) under the
configured precision, with a "fits" column. ``strategy=nd`` layouts are counted from the dry run's
shards (``dry_run.py``: the layout built per rank on the meta device and torch's fake process group).

Files: ``formulas.py`` (the formulas and where each comes from), ``optimizer_state.py`` (the
optimizer's state size, measured on tiny tensors), ``model.py`` (the module built on fake tensors
and the shapes read from it), ``activations.py`` (saved-for-backward bytes, measured),
``plan.py`` (the rows), ``dry_run.py`` / ``nd_plan.py`` (strategy=nd: each rank's shards, its bytes),
``dry_run_command.py`` (``trainer dry-run``), ``table.py`` (the printout), ``__main__.py`` (the command).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from trainer.estimate.plan import Row, Setting, configured_row, strategy_rows

__all__ = ["Row", "Setting", "configured_row", "estimate_config", "strategy_rows"]


def estimate_config(cfg: Any) -> str:
    """The printout for a composed config (conf/estimate.yaml: train.py's config + ``estimate``)."""
    from hydra.utils import get_object, instantiate
    from omegaconf import OmegaConf

    from trainer.cli.hydra_app import check_config_keys, merge_precision
    from trainer.estimate.activations import example_batch, measure_for_precision
    from trainer.estimate.model import build_fake, fake_mode, model_shapes
    from trainer.estimate.nd_plan import comparison_rows, layout_of, nd_row
    from trainer.estimate.table import comparison_table, configured_table, human

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    options = OmegaConf.to_container(cfg.pop("estimate"))
    check_config_keys(cfg)  # train.py's own checks: a typo is refused here as there
    memory_gb = options.get("device_memory_gb")
    if memory_gb is not None and not (isinstance(memory_gb, (int, float)) and memory_gb > 0):
        raise ValueError(f"estimate.device_memory_gb={memory_gb!r} must be a positive number of GiB or null")
    if not isinstance(options.get("activations", True), bool):
        raise ValueError(f"estimate.activations={options['activations']!r} must be true or false")
    unknown = sorted(set(options) - {"device_memory_gb", "activations"})
    if unknown:
        raise ValueError(f"estimate.{unknown[0]} is not an estimator setting; they are device_memory_gb, activations")
    precision = merge_precision(cfg.trainer.get("precision"), instantiate(cfg.precision) if cfg.get("precision") else None)
    precision_name = getattr(precision, "name", "fp32")
    strategy_node = OmegaConf.to_container(cfg.strategy)
    strategy_name = get_object(strategy_node.pop("_target_")).name
    strategy_node.pop("accelerator", None)
    devices, nodes = int(cfg.trainer.devices), int(cfg.trainer.num_nodes)
    world = devices * nodes  # the comparison's world; the configured single row is one device anyway
    # strategy=nd and pipeline x tp: each rank's layout from the dry run (bad degrees: one line, first)
    nd_layout = layout_of(strategy_name, strategy_node, world)
    data_parallel = nd_layout[0].dp if nd_layout else world  # tp ranks (and pipeline stages) share their samples
    batch_size = cfg.data.get("batch_size") or 32  # unset: the trainer's default micro-batch (conf/config.yaml)
    accumulate = int(cfg.trainer.accumulate_grad_batches)
    if cfg.data.get("global_batch_size"):  # then accumulation = global / (micro-batch x data-parallel ranks)
        accumulate = max(1, int(cfg.data.global_batch_size) // (batch_size * data_parallel))
    setting = Setting(world=world, devices_per_node=devices, precision=precision_name, batch_size=batch_size,
                      activation_checkpointing=bool(cfg.trainer.activation_checkpointing),
                      accumulate_grad_batches=accumulate,
                      strategy=strategy_name, options=strategy_node)

    mode = fake_mode()
    module = build_fake(lambda: instantiate(cfg.module), mode)
    shapes = model_shapes(module, mode)
    acts = gathered = None
    act_note = "activations not measured (estimate.activations=false)"
    if options.get("activations", True):
        datamodule = instantiate(cfg.datamodule) if cfg.get("datamodule") is not None else None
        try:
            acts, gathered = measure_for_precision(module, mode, example_batch(module, batch_size, datamodule),
                                                   shapes.blocks, precision, pipeline=bool(shapes.layers))
        except Exception as error:  # e.g. a manual-optimization step that needs a running Trainer
            act_note = (f"activations not measured ({type(error).__name__}: {error}); the figures below leave "
                        "them out (estimate.activations=false skips the attempt)")
    if acts is not None:
        checkpointed = (f"{human(acts.checkpointed)} with activation checkpointing" if shapes.blocks else
                        "no activation checkpointing (no block_classes() / ModuleList blocks)")
        act_note = (f"activations per micro-batch of {batch_size} (measured, saved for backward): "
                    f"{human(acts.total)} plain, {checkpointed}"
                    + (f"\n  with the weights gathered in {precision.compute_dtype} (FSDP): {human(gathered.total)} plain, "
                       f"{human(gathered.checkpointed)} with activation checkpointing" if gathered else ""))
    make_module = partial(instantiate, cfg.module)  # the dry run builds its own, on the meta device
    if nd_layout:
        dims, layout = nd_layout
        configured = nd_row(strategy_name, make_module, dims, shapes, acts, setting, strategy_node, gathered=gathered,
                            layout=layout)
    else:
        configured = configured_row(module, shapes, acts, setting, gathered)
    rows = strategy_rows(module, shapes, acts, setting, gathered)
    rows += comparison_rows(module, make_module, shapes, acts, setting, gathered)
    label = "pp rank" if strategy_name == "pipeline" and not nd_layout else "rank"  # nd rows: every rank
    return "\n".join([
        f"{type(module).__name__}: {shapes.numel:,} parameters; precision {precision_name}; "
        f"{world} rank(s) ({devices} per node x {nodes} node(s)); micro-batch {batch_size} x {accumulate} accumulated; "
        f"activation checkpointing {'on' if setting.activation_checkpointing else 'off'}",
        act_note,
        "",
        f"configured: {configured.name}" + (f" ({configured.detail})" if configured.detail else "")
        + (f"; {configured.note}" if configured.note else ""),
        configured_table(configured, memory_gb, label, measured=acts is not None),
        "",
        "all strategies (largest rank each" + (f"; fits in {memory_gb} GiB" if memory_gb else "") + "):",
        comparison_table(rows, memory_gb, setting.activation_checkpointing, measured=acts is not None),
    ])
