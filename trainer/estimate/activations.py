"""Activation bytes of one micro-batch, measured on fake tensors (no memory is used).

``measure_activations`` runs the module's ``training_step`` (and, for the pipeline, its
``pipeline_layers`` one after the other and ``pipeline_loss``) on a micro-batch built from the
module's own first training sample repeated ``batch_size`` times, with the module and batch as
fake tensors (``FakeTensorMode``: meta storage, device reported as CPU so autocast applies as in
training). A ``saved_tensors_hooks`` pack hook sees every tensor autograd keeps for backward; the
activation figure is the bytes of their distinct storages, parameters excluded (mixed precision's
low-precision weight casts are kept for backward, so they count here). Each saved tensor is also
attributed to the innermost block (``block_classes()``) and pipeline layer running when it was saved.

With activation checkpointing (a stated formula on the measured parts): the blocks keep only their
inputs, and backward recomputes one block at a time, so
``outside blocks + sum of the blocks' input bytes + the largest block's saved bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class ActivationBytes:
    """Saved-for-backward bytes of one micro-batch of ``batch_size`` samples."""

    batch_size: int
    total: int = 0
    outside_blocks: int = 0
    block_saved: list[int] = field(default_factory=list)
    block_inputs: list[int] = field(default_factory=list)
    #: per pipeline layer (``pipeline_layers()`` run one after the other), when the module has them
    per_layer: list[int] = field(default_factory=list)

    @property
    def checkpointed(self) -> int:
        """With ``trainer.activation_checkpointing`` (see the module docstring)."""
        if not self.block_saved:
            return self.total
        return self.outside_blocks + sum(self.block_inputs) + max(self.block_saved)


class _Recorder:
    """Pack hook plus forward hooks that attribute each saved storage to the running block / layer."""

    def __init__(self, module: nn.Module, blocks: list[nn.Module], layers: list[nn.Module]):
        self.params = {p.untyped_storage()._cdata for p in module.parameters()}
        self.saved: dict[int, tuple[int, int | None, int | None]] = {}  # storage -> (bytes, block, layer)
        self.block_inputs = [0] * len(blocks)
        self.block: list[int] = []  # stack of running block indices
        self.layer: list[int] = []
        self.handles = []
        for index, block in enumerate(blocks):
            self.handles.append(block.register_forward_pre_hook(self._enter(self.block, index, inputs=True)))
            self.handles.append(block.register_forward_hook(self._leave(self.block)))
        for index, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._enter(self.layer, index)))
            self.handles.append(layer.register_forward_hook(self._leave(self.layer)))

    def _enter(self, stack: list[int], index: int, inputs: bool = False):
        def hook(module, args):
            stack.append(index)
            if inputs:
                self.block_inputs[index] = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))
        return hook

    def _leave(self, stack: list[int]):
        def hook(module, args, output):
            stack.pop()
        return hook

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in self.params and storage._cdata not in self.saved:
            self.saved[storage._cdata] = (storage.nbytes(), self.block[-1] if self.block else None,
                                          self.layer[-1] if self.layer else None)
        return tensor

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _IgnoreLogs:
    """Stands in for a run's log collector: ``self.log`` in a measured ``training_step`` does nothing."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass


def example_batch(module: Any, batch_size: int, datamodule: Any = None) -> Any:
    """A micro-batch of ``batch_size`` copies of the first training sample (real, small), from the
    same hooks training reads: the datamodule's where one is given (its hooks win, as in ``fit``),
    ``train_dataloader()`` (its dataset and ``collate_fn``) else ``train_dataset()``; collated by
    the loader's ``collate_fn`` or the module's ``collate_fn``."""
    source = datamodule if datamodule is not None else module
    if datamodule is not None and hasattr(datamodule, "setup"):
        datamodule.setup("fit")
    loader = source.train_dataloader() if hasattr(source, "train_dataloader") else None
    if loader is not None:
        dataset, collate = loader.dataset, loader.collate_fn
    else:
        dataset = source.train_dataset()
        collate = getattr(module, "collate_fn", None) or torch.utils.data.default_collate
    if dataset is None or len(dataset) == 0:
        raise ValueError(f"{type(source).__name__} gave no training sample to take the micro-batch's shape from")
    return collate([dataset[0]] * batch_size)


def measure_activations(module: nn.Module, mode: Any, batch: Any, blocks: list[nn.Module],
                        compute_dtype: torch.dtype | None, pipeline: bool = False) -> ActivationBytes:
    """Saved-for-backward bytes of ``module.training_step(batch)`` (``pipeline``: the pipeline
    layers then ``pipeline_loss``), ``module`` built under the fake ``mode``; ``compute_dtype``:
    autocast's dtype under mixed precision (None: none)."""
    from torch.utils._pytree import tree_flatten, tree_map

    fake = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, batch)
    layers = module.pipeline_layers() if pipeline else []
    recorder = _Recorder(module, blocks, layers)
    autocast = torch.autocast("cpu", dtype=compute_dtype, enabled=compute_dtype is not None)
    module._log_collector = _IgnoreLogs()  # (the attribute TrainModule.log writes through)
    try:
        with mode, autocast, torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
            if pipeline:
                x = module.pipeline_input(fake)
                for layer in layers:
                    x = layer(x)
                module.pipeline_loss(x, fake)
            else:
                module.training_step(fake, 0)
    finally:
        recorder.remove()
        del module._log_collector
    leaves = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    result = ActivationBytes(batch_size=leaves[0].shape[0] if leaves else 0, block_saved=[0] * len(blocks), block_inputs=recorder.block_inputs,
                             per_layer=[0] * len(layers))
    for nbytes, block, layer in recorder.saved.values():
        result.total += nbytes
        if block is None:
            result.outside_blocks += nbytes
        else:
            result.block_saved[block] += nbytes
        if layer is not None:
            result.per_layer[layer] += nbytes
    return result


def _convert(module: nn.Module, mode: Any, dtype: torch.dtype) -> None:
    """``module.to(dtype)`` for fake weights: ``nn.Module._apply`` cannot swap a tensor subclass's
    data, so each floating-point parameter and buffer is replaced (as the same kind of entry)."""
    with mode:
        for owner in module.modules():
            for name, p in owner._parameters.items():
                if p is not None and p.is_floating_point():
                    owner._parameters[name] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            for name, b in owner._buffers.items():
                if b is not None and b.is_floating_point():
                    owner._buffers[name] = b.to(dtype)


def _to(dtype: torch.dtype, batch: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, batch)


def measure_for_precision(module: nn.Module, mode: Any, batch: Any, blocks: list[nn.Module], precision: Any,
                          pipeline: bool) -> tuple[ActivationBytes, ActivationBytes | None]:
    """``(activations, gathered)`` under ``precision`` (trainer/precision ``Precision``), with the
    per-pipeline-layer figures when ``pipeline``. bf16-true converts the module and the batch first,
    as training does. Mixed precision: ``activations`` autocast from fp32 weights (the casts are kept
    for backward), ``gathered`` with the weights already in the compute dtype (as FSDP gathers them);
    otherwise ``gathered`` is None (the same). Converts ``module``'s fake weights in place."""
    name = getattr(precision, "name", "fp32")
    mixed = getattr(precision, "mixed", False)
    compute = precision.compute_dtype if mixed else None
    if name == "bf16-true":
        _convert(module, mode, torch.bfloat16)
        batch = _to(torch.bfloat16, batch)

    def measure() -> ActivationBytes:
        result = measure_activations(module, mode, batch, blocks, compute)
        if pipeline:
            result.per_layer = measure_activations(module, mode, batch, [], compute, pipeline=True).per_layer
        return result

    acts = measure()
    if not mixed:
        return acts, None
    _convert(module, mode, compute)
    return acts, measure()
