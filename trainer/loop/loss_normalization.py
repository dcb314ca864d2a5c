"""How a step's micro-batch losses become the global batch's gradient (``trainer.loop.loss_normalization``).

- ``mean``: each micro-batch backwards its mean loss x its share of the global batch x the ranks the
  gradient sync averages over (``data_parallel_size``), so the synced gradient is the global-batch mean.
- ``tokens``: each micro-batch backwards its loss x its token count (trainer/loop/token_weights.py); after
  the micro-batches the gradients are divided by the global token count (one all-reduce per step).

The metrics are weighted alike: by real samples (``mean``) or by tokens (``tokens``).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.runtime.comms_log import TOKEN_COUNT_KIND, labelled
from trainer.loop.step_accounting import TokenCount
from trainer.loop.token_weights import token_weighted


class LossNormalization:
    """One run's loss normalisation.

    Args:
        how: ``trainer.loop.loss_normalization`` ("mean" or "tokens").
        data_parallel_size: the ranks whose gradients the sync averages (``strategy.data_parallel_size()``).
        device: where the token counts are kept.
    """

    def __init__(self, how: str, data_parallel_size: int, device: torch.device):
        self.by_tokens = how == "tokens"
        self.data_parallel_size = data_parallel_size
        self.device = device

    def begin_step(self) -> TokenCount | None:
        """This step's local token count (``tokens``), else None."""
        return TokenCount(self.device) if self.by_tokens else None

    def weight(self, num_tokens: Any, num_real: int) -> Any:
        """A micro-batch's weight in the metrics and the loss: its token count (``tokens``; required),
        else its real samples."""
        if not self.by_tokens:
            return num_real
        if num_tokens is None:
            raise ValueError("loss_normalization='tokens' needs training_step to return 'num_tokens'")
        return num_tokens

    def sample_factor(self, global_count: int) -> float:
        """The factor per real sample that makes a micro-batch's mean loss its part of the global-batch
        mean after the sync's average (``mean``; the pipeline's schedule applies it per microbatch)."""
        return self.data_parallel_size / global_count

    def loss_to_backward(self, loss: torch.Tensor, weight: Any, global_count: int,
                         local_tokens: TokenCount | None) -> torch.Tensor:
        """The micro-batch's loss to backward (before the precision's loss scaling)."""
        if self.by_tokens:
            local_tokens.add(weight)
            # Backward the token sum; gradients are divided by the global token count after the step's
            # micro-batches (`divide_by_global_tokens`). Counts are not rounded.
            return token_weighted(loss, weight)
        # Mean over the micro-batch x its share of the global batch x the ranks the sync
        # averages over = this micro-batch's part of the global-batch mean. (Not ``weight *
        # sample_factor``: the float product's order is the one the equivalence tests were set on.)
        factor = weight * self.data_parallel_size / global_count
        # (x * 1.0 is x exactly, and so is its gradient: a full global batch of one micro-batch per rank
        # skips the multiplication and its backward)
        return loss if factor == 1 else loss * factor

    def divide_by_global_tokens(self, grads: list[torch.Tensor], local_tokens: TokenCount, strategy: Any) -> None:
        """``tokens``: divide the (local, synced) gradients by the global token count, times the sync's
        average. One all-reduce, no host sync."""
        with labelled(TOKEN_COUNT_KIND):
            global_tokens = strategy.all_reduce_sum(local_tokens.total())
        torch._foreach_mul_(grads, (self.data_parallel_size / global_tokens.clamp_min(1)).to(torch.float32))
