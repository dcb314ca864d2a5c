"""``grad_norm(module, norm_type)``: each parameter's gradient norm and their total, Lightning's names
(``grad_2.0_norm/<parameter>``, ``grad_2.0_norm_total``), for ``self.log_dict`` in
``on_before_optimizer_step``. Under FSDP a parameter's gradient is sharded: its norm is the norm of
the whole gradient (a collective every rank runs, as the hook runs on every rank)."""

from __future__ import annotations

import torch
from torch import nn


def _norm(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    norm = torch.linalg.vector_norm(grad.detach(), ord=norm_type)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor (FSDP): the norm over every rank's shard
    return full_tensor() if full_tensor is not None else norm


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, torch.Tensor]:
    """The ``norm_type``-norm (a number > 0, or "inf") of each parameter's gradient that exists, and
    of all of them together (``grad_{norm_type}_norm_total``); an empty dict when no gradient exists."""
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"grad_norm(norm_type={norm_type}): use a positive number or 'inf'")
    norms = {f"grad_{norm_type}_norm{group_separator}{name}": _norm(p.grad, norm_type)
             for name, p in module.named_parameters() if p.grad is not None}
    if norms:
        total = torch.linalg.vector_norm(torch.stack(list(norms.values())), ord=norm_type)
        norms[f"grad_{norm_type}_norm_total"] = total
    return norms
