"""The pieces the text recipes' tensor-parallel plans share (torchtitan's layout).

Between the blocks the residual stream is sharded along the sequence (``Shard(1)``: sequence
parallel); the norms run on that shard; each attention / MLP entry gathers it back
(``PrepareModuleInput``: ``Shard(1)`` -> ``Replicate``), its input projections split the heads or the
hidden width (``ColwiseParallel``) and its output projection reduce-scatters back onto the sequence
shard (``RowwiseParallel`` with ``Shard(1)`` output). The vocabulary projection returns logits
sharded over the vocabulary for loss parallel, or gathered when the strategy's loss parallel is off.
"""

from __future__ import annotations

from typing import Any

import torch


def loss_parallel_enabled(module: Any) -> bool:
    """Whether the run computes the loss on vocabulary-sharded logits: the strategy's
    ``loss_parallel`` flag (true unless the strategy says otherwise; outside a run: true)."""
    trainer = module.__dict__.get("_trainer")
    strategy = getattr(trainer, "strategy", None) if trainer is not None else None
    flag = getattr(strategy, "loss_parallel", True)
    if not isinstance(flag, bool):
        raise ValueError(f"strategy.loss_parallel={flag!r} must be true or false")
    return flag


def gather_sequence() -> Any:
    """The attention / MLP entry: the sequence-sharded stream, gathered for the split projections."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))


def token_embedding() -> Any:
    """The token embedding: vocabulary rows split, output reduce-scattered onto the sequence shard."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))


def block_output() -> Any:
    """A block branch's output projection: its input split, output reduce-scattered onto the sequence shard."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(output_layouts=Shard(1))


def vocabulary_head(loss_parallel: bool) -> Any:
    """The vocabulary projection on the sequence-sharded stream: logits sharded over the vocabulary
    (a DTensor, for loss parallel), or gathered into a plain tensor of the full vocabulary."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1) if loss_parallel else Replicate(),
                           use_local_output=not loss_parallel)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of ``logits`` ``[..., vocabulary]`` against ``targets``, as a plain tensor.
    Vocabulary-sharded logits (a DTensor) get the targets as a replicated DTensor: inside
    ``loss_parallel()`` the loss is computed on the shards; outside (an evaluation the strategy did
    not wrap) DTensor gathers the vocabulary first, the same value."""
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(logits, DTensor):
        targets = DTensor.from_local(targets, logits.device_mesh, [Replicate()], run_check=False)
    return plain_loss(F.cross_entropy(logits.flatten(0, -2), targets.flatten()))


def plain_loss(loss: torch.Tensor) -> torch.Tensor:
    """The loss as a plain tensor: loss parallel's cross entropy returns a replicated DTensor; its
    full value (differentiable, so backward still runs through the sharded logits)."""
    from torch.distributed.tensor import DTensor

    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def check_degree(tp: int, **counts: int) -> None:
    """ValueError, one line, unless ``tp`` divides every count: the head counts (tensor parallel
    splits the heads) and ``block_size`` (sequence parallel splits the sequence into equal shards)."""
    if all(count % tp == 0 for count in counts.values()):
        return
    allowed = [d for d in range(1, min(counts.values()) + 1) if all(c % d == 0 for c in counts.values())]
    names = [f"module.{name}={count}" for name, count in counts.items()]
    values = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    raise ValueError(f"strategy.tp={tp} must divide {values} (tensor parallel splits the attention heads, sequence "
                     f"parallel the sequence); allowed tp: {', '.join(map(str, allowed))}")
