"""What strategy=nd's step needs around DTensors: the wrapper the loop calls (plain-tensor outputs,
loss parallel in evaluation), the gradient norm over every mesh dimension, clipping by it."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn

from trainer.api.hook_calls import call_step
from trainer.runtime.tensors import local_tensor
from trainer.strategies.base import TrainingStepForward


def plain_outputs(output: Any) -> Any:
    """``output`` with every DTensor in it (nested dicts / lists / tuples) made a full plain tensor:
    the loop sums, logs and returns plain tensors. Differentiable: a loss's backward still flows
    into the DTensor graph (a replicated loss is read locally, no collective). A tensor that needs a
    gradient comes out as a tensor of its own, never a view (``own_storage``)."""
    from torch.distributed.tensor import DTensor

    if isinstance(output, DTensor):
        output = output.full_tensor()
    if isinstance(output, torch.Tensor):
        return own_storage(output)
    if isinstance(output, dict):
        return {key: plain_outputs(value) for key, value in output.items()}
    if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
        return type(output)(plain_outputs(value) for value in output)
    return output


def own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, copied if it is a view that needs a gradient. The step wrapper is FSDP2's root under
    dp_shard > 1, and FSDP2 registers its pre-backward hook (which all-gathers the root's parameters
    for their gradients) on each output that needs a gradient; an in-place op on a view would drop
    that hook, so FSDP2 warns, on every rank, for a view output. The loss under tensor parallel is
    one: ``DTensor.full_tensor()`` (here, or the module's own, as the recipes' ``plain_loss``) returns
    a view of the gathered local tensor (torch's ``to_local`` makes it with ``view_as``). The copy's
    backward passes the gradient through as it is: the gradients are the same bit for bit. Logged
    values (no gradient) are not copied; a loss is a scalar."""
    if tensor.requires_grad and tensor._base is not None:
        return tensor.clone()
    return tensor


def loss_parallel_once() -> ContextManager:
    """torch's ``loss_parallel()``, or nothing where it is active already: it cannot nest (its exit
    removes the loss ops it added, and a second exit fails), and a manual-optimization step enters it
    around the hook while ``no_backward_sync()`` inside enters it again through ``sync_context``."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss, loss_parallel

    handlers = getattr(getattr(DTensor, "_op_dispatcher", None), "_custom_op_handlers", {})
    ops = getattr(loss, "customized_loss_ops", {})
    if ops and all(op in handlers for op in ops):
        return contextlib.nullcontext()
    return loss_parallel()


class NDStepForward(TrainingStepForward):
    """The step the loop calls under strategy=nd: the hook's outputs as plain tensors. With
    ``loss_parallel``, every hook runs inside torch's ``loss_parallel()`` (an automatic training
    step's forward and backward are inside it already, through ``sync_context``; a manual one's
    ``manual_backward`` runs inside the hook), so a cross-entropy over logits sharded on the
    vocabulary works in each."""

    def __init__(self, module: nn.Module, loss_parallel: bool = False):
        super().__init__(module)
        self.loss_parallel = loss_parallel

    def forward(self, batch: Any, batch_idx: int, hook: str = "training_step") -> Any:
        with loss_parallel_once() if self.loss_parallel else contextlib.nullcontext():
            return plain_outputs(call_step(self.module, hook, batch, batch_idx))


def grad_norm_over_meshes(module: nn.Module) -> torch.Tensor:
    """The global 2-norm of every gradient of ``module``: plain tensors (the same on every rank) and
    DTensors on any mesh with any placements (tensor-parallel shards, FSDP shards, both), each group
    of one mesh and placements reduced over its mesh (``full_tensor``), then combined. The groups are
    met in parameter order, the same on every rank, so the collectives match."""
    from torch.distributed.tensor import DTensor

    plain: list[torch.Tensor] = []
    groups: dict[Any, list[torch.Tensor]] = {}
    for parameter in module.parameters():
        grad = parameter.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            groups.setdefault((grad.device_mesh, tuple(grad.placements)), []).append(grad)
        else:
            plain.append(grad)
    norms = [torch.nn.utils.get_total_norm(plain)] if plain else []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(norms)


def scale_gradients(module: nn.Module, max_norm: float, total: torch.Tensor) -> None:
    """Clip by a global norm computed already: every gradient (each rank's local part) times
    ``min(1, max_norm / (total + 1e-6))``, as ``torch.nn.utils.clip_grads_with_norm_``."""
    grads = [local_tensor(p.grad) for p in module.parameters() if p.grad is not None]
    if not grads:
        return
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coefficient.to(grads[0].device))
