"""The model summary printed at the start of ``fit`` (``Trainer(enable_model_summary=True)``).

Like Lightning's table: one row per top-level child module (name, type, parameters), then the
trainable, frozen and total counts and the size in MB (each parameter's element size, so a bf16
model is half an fp32 one). The counts are of the whole model on every strategy. Where a rank
holds only part of it (FSDP: its shard of each parameter; pipeline: its stages' layers) a last
column and a line give each rank's share, gathered once at the start (one collective, never per step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from trainer.runtime import distributed


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard on this rank


@dataclass
class ModelSummary:
    """Parameter counts of a model: ``rows`` are (name, type, parameters, this rank's share)."""

    rows: list[tuple[str, str, int, int]]
    trainable: int
    frozen: int
    size_bytes: int
    local_total: int
    #: parameters held by each rank (filled by `gather_shares`; [local_total] in one process)
    rank_shares: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 1e6

    @property
    def sharded(self) -> bool:
        """Whether some rank holds less than the whole model."""
        return any(share != self.total for share in self.rank_shares)

    def gather_shares(self) -> None:
        """Every rank's ``local_total`` (a collective: call on every rank)."""
        self.rank_shares = [int(n) for n in distributed.all_gather_object(self.local_total)]

    def table(self) -> str:
        """The summary as Lightning prints it (with a "this rank" column when the model is split)."""
        header = ["", "Name", "Type", "Params"] + (["Rank 0 holds"] if self.sharded else [])
        lines = [[str(i), name, kind, _human(count)] + ([_human(local)] if self.sharded else [])
                 for i, (name, kind, count, local) in enumerate(self.rows)]
        widths = [max(len(row[c]) for row in [header, *lines]) for c in range(len(header))]
        rule = "-" * (sum(widths) + 3 * (len(widths) - 1))
        out = [rule, " | ".join(h.ljust(w) for h, w in zip(header, widths)), rule]
        out += [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in lines]
        out += [rule,
                f"{_human(self.trainable):<8} Trainable params",
                f"{_human(self.frozen):<8} Non-trainable params",
                f"{_human(self.total):<8} Total params",
                f"{self.size_mb:<8.3f} Total estimated model params size (MB)"]
        if self.sharded:
            shares = ", ".join(f"rank {r}: {_human(n)}" for r, n in enumerate(self.rank_shares))
            out.append(f"Params held per rank: {shares}")
        return "\n".join(out)


def _human(count: int) -> str:
    """Lightning's style: 1.2 K, 3.4 M."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return str(count)


def summarize(module: nn.Module) -> ModelSummary:
    """Count ``module``'s parameters by top-level child: call before the strategy splits the model
    (meta-device parameters count too), then `ModelSummary.count_local` after."""
    rows, trainable, frozen, size = [], 0, 0, 0
    for param in module.parameters():
        if param.requires_grad:
            trainable += param.numel()
        else:
            frozen += param.numel()
        size += param.numel() * param.element_size()
    for child_name, child in module.named_children():
        count = sum(p.numel() for p in child.parameters())
        rows.append((child_name, type(child).__name__, count, count))
    total = trainable + frozen
    return ModelSummary(rows, trainable, frozen, size, total, [total])


def count_local(summary: ModelSummary, module: nn.Module) -> None:
    """This rank's share of each row of ``summary`` once the strategy split ``module`` (FSDP
    shards, pipeline stages), gathered over the ranks (a collective: every rank calls it)."""
    local = {name: _local(p).numel() for name, p in module.named_parameters()}
    summary.rows = [(name, kind, count, sum(n for key, n in local.items() if key.startswith(name + ".")))
                    for name, kind, count, _ in summary.rows]
    summary.local_total = sum(local.values())
    summary.gather_shares()
