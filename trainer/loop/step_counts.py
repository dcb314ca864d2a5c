"""Manual optimization on several ranks: every rank must call ``opt.step()`` as often as the others
(``global_step`` counts each rank's own calls, and ``max_steps`` stops each rank on its own count).
Ranks whose counts part would stop at different batches and wait in a collective until its timeout;
instead the counts are compared where the ranks already agree, and unequal ones raise, on every
rank, one error naming each rank's count:

- once after the first batch of a fit (a fresh one or a resumed one): before any rank could foresee
  its last batch (``max_steps``) differently from the others (trainer/loop/step_limits.py);
- on every logging step, in the agreement on ``trainer.should_stop`` made there (no new collective).

A module whose counts part later between two logging steps, with ``max_steps`` near, can still reach
its last batch on one rank first: the check cannot foresee that without a collective on every step.
"""

from __future__ import annotations

from trainer.runtime import distributed


def check_equal(counts: list[int], step: int) -> None:
    """Raise when the ranks' ``global_step`` values ``counts`` (``counts[r]``: rank r's) differ,
    after batch ``step``; the same answer on every rank (all hold the same counts)."""
    if len(set(counts)) <= 1:
        return
    ranks_of: dict[int, list[int]] = {}
    for rank, count in enumerate(counts):
        ranks_of.setdefault(count, []).append(rank)
    named = "; ".join(f"rank {', '.join(map(str, ranks))}: {count}" for count, ranks in ranks_of.items())
    raise RuntimeError(
        f"manual optimization: the ranks called opt.step() a different number of times by batch {step} "
        f"(global_step per rank: {named}); every rank must step its optimizers equally often in each "
        "training_step (max_steps and the gradient sync count on it)")


class FirstBatchCheck:
    """The once-per-fit comparison after the first batch (only with manual optimization on several
    ranks); a first batch that is a logging step leaves it to that step's agreement."""

    def __init__(self, manual: bool):
        self.pending = manual and distributed.is_distributed()

    def after_batch(self, global_step: int, step: int, logging_step: bool) -> None:
        if not self.pending:
            return
        self.pending = False
        if not logging_step:
            _, counts = distributed.any_rank_and_values(False, global_step)
            check_equal(counts, step)
