"""The module's model hooks: how its layers are built (``configure_model``, ``init_weights``), which
blocks FSDP wraps (``block_classes``), and how tensor parallelism (``tensor_parallel_plan``) and the
pipeline (``pipeline_layers``, ``pipeline_input``, ``pipeline_loss``) split it. A mixin of
`TrainModule`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ModelHooks:
    """The hooks that build the model and say how strategies split it (TrainModule's)."""

    def configure_model(self) -> None:
        """Build the layers here when they should be created on each rank rather than in ``__init__``
        (the launcher process then never holds the weights). Runs after seeding, so every rank
        builds identical initial weights."""

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        """The classes of the model's repeated blocks (e.g. the transformer block). FSDP makes
        each block its own sharding unit (``strategy.wrap=auto``); () lets the strategy guess."""
        return ()

    def check_sharding_units(self) -> None:
        """Raise ValueError when FSDP (``strategy.wrap=auto``) cannot find this model's blocks by
        itself, saying what to declare. Called before any worker starts, without building the
        model; the default accepts (FSDP then uses ``block_classes()`` or guesses)."""

    # ----- tensor parallel (strategy=nd with strategy.tp > 1) ----------------------------------------
    def tensor_parallel_plan(self) -> dict[str, Any] | None:
        """How tensor parallelism splits the model: ``{submodule name: ParallelStyle}`` with names
        relative to this module and ``*`` for any one name segment, e.g. ``{"model.blocks.*.mlp.up":
        ColwiseParallel(), "model.blocks.*.mlp.down": RowwiseParallel()}`` (styles from
        ``torch.distributed.tensor.parallel``). The strategy applies it over the mesh's ``tp``
        dimension before activation checkpointing, compile and FSDP (torchtitan's order); a name
        that matches no submodule is refused. None (the default): no plan; a ``configure_model``
        that applies its own (with ``self.device_mesh``, Lightning's way) is used as it is."""
        return None

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise ValueError when the model cannot be split over ``tp`` tensor-parallel ranks (e.g.
        more ranks than attention heads). Called before any worker starts, without building the
        model; the default accepts any degree."""

    @property
    def device_mesh(self) -> Any:
        """The run's DeviceMesh under strategy=nd (dimensions ``pp``, ``dp_replicate``, ``dp_shard``,
        ``cp``, ``tp`` and the flattened ``dp``), set before ``configure_model``; None under the other
        strategies and outside a run."""
        return self.__dict__.get("_device_mesh")

    # ----- pipeline parallel (strategy=pipeline) ---------------------------------------------------
    def check_pipeline(self) -> None:
        """Raise ValueError when the model cannot be cut into pipeline stages, saying what to use
        instead. Called before any worker starts under strategy=pipeline (and ``strategy.pp > 1``),
        without building the model; the default accepts (``pipeline_layers`` then decides)."""

    def pipeline_layers(self) -> list[nn.Module] | None:
        """The model as an ordered list of layers for pipeline parallelism (like DeepSpeed's
        LayerSpec list): ``layers[0]`` takes ``pipeline_input(batch)``, each next layer takes the
        previous one's output (one tensor), the last one's output goes to ``pipeline_loss``. The
        layers must be this module's own submodules (or thin wrappers holding them), so that
        parameter names stay those of the whole model. None (the default): no pipeline."""
        return None

    def pipeline_input(self, batch: Any) -> torch.Tensor:
        """What the first pipeline layer takes from a batch (default: its first element)."""
        return batch[0] if isinstance(batch, (list, tuple)) else batch

    def pipeline_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        """The loss (mean over the micro-batch) from the last layer's ``output`` and the matching
        slice of the batch, or a dict with "loss" and more metrics, as ``training_step`` returns.
        Runs on the last pipeline stage; under strategy=pipeline it replaces ``training_step``
        and ``validation_step`` (during validation the module is in eval mode: ``self.training``
        is False, so validation-only metrics can be returned then)."""
        raise NotImplementedError(f"{type(self).__name__} must implement pipeline_loss() for strategy=pipeline")

    def init_weights(self, module: nn.Module) -> None:
        """Initialise the parameters and buffers that ``module`` (a submodule of this model, or
        the model itself) holds directly. Called for every submodule in ``modules()`` order:
        only on models built on the meta device (``strategy.meta_init=true``), unless you override
        it; an override owns initialisation and runs on every build, eager or meta, seeded
        the same, so both give identical weights. Default: ``module.reset_parameters()``."""
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
