"""``self.log(..., on_step=True)`` in an evaluation pass (validation, test): the value of each global
evaluation batch, written as Lightning writes it (``name_step`` when the name is also logged on_epoch,
else ``name``), at a step that counts the stage's evaluation batches of this call (Lightning's axis for
these rows: fit's validation passes continue it, each ``validate`` / ``test`` call starts at 0).

A global evaluation batch is every rank's batch at one position of the pass; its value is the
sample-weighted mean (or sum, max, min) over those batches, the same on any world size for the same
global batch. Every rank reduces once per position of the busiest rank (a rank without a batch there
adds nothing); whether the pass has such values at all is agreed once, after its first position (one
tiny all-reduce per pass on several ranks), so a pass that logs none makes no collective per batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.runtime import distributed

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun


class EvalStepLogs:
    """One pass's per-batch values: ``after_batch()`` after each of this rank's batches, ``finish()``
    after its last one. ``positions``: the busiest rank's batch count (None: unknown, a stream);
    ``written``: False for a pass whose values are not logged (the sanity check)."""

    def __init__(self, run: RankRun, stage: str, positions: int | None, written: bool = True):
        self.run, self.stage, self.positions, self.written = run, stage, positions, written
        self.done = 0
        self.active: bool | None = None  # decided after the first position

    def after_batch(self) -> None:
        run, logs = self.run, self.run.module_logs
        if not self.written:
            logs.discard_eval_step()
            return
        if self.active is None:
            local = logs.logs_eval_steps(self.stage)
            self.active = distributed.any_rank(local) if distributed.world_size() > 1 else local
            if self.active and self.positions is None and distributed.world_size() > 1:
                raise ValueError(f"self.log(..., on_step=True) in the {self.stage} pass of a stream (an "
                                 "IterableDataset) on several ranks: its ranks' batch counts are unknown up front, so "
                                 "the global batches cannot be paired; log with on_step=False (the pass's aggregate)")
        self.done += 1
        if not self.active:
            return
        values = logs.eval_step_metrics(run.strategy)
        if values:
            run.log_eval_step(self.stage, values)

    def finish(self) -> None:
        """The positions where this rank had no batch and a busier rank had one."""
        while self.positions is not None and self.written and self.done < self.positions:
            self.after_batch()
