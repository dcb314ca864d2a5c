"""``self.log(..., on_step=True)`` in an evaluation pass (validation, test): the value of each global
evaluation batch, written as Lightning writes it (``name_step`` when the name is also logged on_epoch,
else ``name``), at a step that counts the batches of that loader in the stage (Lightning's axis for
these rows: each of several loaders counts its own; fit's validation passes continue the count until
the loaders are read again, each ``validate`` / ``test`` call starts at 0).

A global evaluation batch is every rank's batch at one position of the pass; its value is the
sample-weighted mean (or sum, max, min) over those batches, the same on any world size for the same
global batch. As Lightning's, a batch's row also holds the names logged earlier in the pass (in this
loader) at their last values, and a batch that logs nothing still counts on the step axis. Every rank
reduces once per position of the busiest rank (a rank without a batch there adds nothing); whether the
pass has such values at all is agreed once, after its first position (one tiny all-reduce per pass on
several ranks), so a pass that logs none makes no collective per batch (a pass whose first batch logs
no such value writes none: a warning says so).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainer.runtime import distributed

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


class EvalStepLogs:
    """One pass's per-batch values: ``after_batch()`` after each of this rank's batches, ``finish()``
    after its last one. ``positions``: the busiest rank's batch count (None: unknown, a stream);
    ``written``: False for a pass whose values are not logged (the sanity check); ``dataloader_idx``:
    the loader (None: the stage's only one)."""

    def __init__(self, run: RankRun, stage: str, positions: int | None, written: bool = True,
                 dataloader_idx: int | None = None):
        self.run, self.stage, self.positions, self.written = run, stage, positions, written
        self.dataloader_idx = dataloader_idx
        self.done = 0
        self.active: bool | None = None  # decided after the first position
        self.latest: dict[str, float] = {}  # the last value of each name logged on_step in this pass

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
        # (every written position counts, logged or not, as Lightning's per-loader batch count)
        key = (self.stage, self.dataloader_idx)
        step = run.eval_steps_logged[key] = run.eval_steps_logged.get(key, -1) + 1
        if not self.active:
            logs.discard_eval_step()
            return
        # (as Lightning: a name logged earlier in the pass is in the later batches' rows, at its last value)
        self.latest.update(logs.eval_step_metrics(run.strategy))
        if self.latest:
            run.log_eval_step(dict(self.latest), step)

    def finish(self) -> None:
        """The positions where this rank had no batch and a busier rank had one."""
        while self.positions is not None and self.written and self.done < self.positions:
            self.after_batch()
        if self.written and self.active is False and self.run.module_logs.logs_eval_steps(self.stage):
            log.warning("self.log(..., on_step=True) in the %s pass was first called after its first batch: "
                        "that pass writes no per-batch rows (whether a pass writes them is agreed by the ranks at "
                        "its first batch); the next %s passes of this call write them", self.stage, self.stage)
