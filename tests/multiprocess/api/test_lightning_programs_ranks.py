"""The Lightning-idiom programs (tests/support/lightning_programs/, imports rewritten to
``trainer.lightning``) train the same on 2 ranks as on one process at the same global batch: DDP 2 and
FSDP 2 (the trainer spawns the ranks; each program gives each rank half the one-process batch, the
DataModule program by dividing by ``self.trainer.world_size``) against one process: the logged metrics
at every value hook, the results of validate / test / predict, the final and reloaded parameters, and
rank 0's hook calls.

Not compared: the loss a step returns (each rank's own mean, by nature), what the program reads back
from its own DataModule object (it ran in the spawned ranks, not in the caller), and the trainer's
own timing and memory reports.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.lightning_oracle import PROGRAMS, ProgramRun, assert_same_calls, assert_same_numbers, assert_same_values
from tests.support.program_runs import ProgramRuns

pytestmark = pytest.mark.timeout(600)

RTOL, ATOL = 1e-5, 1e-6
STRATEGIES = ("ddp", "fsdp")
#: results that are this process's own, not the training's (see the module docstring)
PROCESS_LOCAL = ("process_local",)
RETURNED_LOSS = "<returned loss>"
#: the trainer's own reports that differ between runs by nature (times, throughput, memory)
BY_NATURE = ("perf/", "memory/")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return ProgramRuns(tmp_path_factory.mktemp("lightning_programs_ranks"))


def _comparable(run: ProgramRun) -> ProgramRun:
    """``run`` without the per-rank returned loss, with the predictions as one tensor (one process
    predicts in batches of the global batch, each rank in its half)."""
    values = [(hook, {k: v for k, v in snapshot.items() if k != RETURNED_LOSS}) for hook, snapshot in run.values]
    numbers = {k: v for k, v in run.numbers.items() if not k.startswith("predict[")}
    predictions = run.results.get("predict")
    if predictions:
        numbers["predict"] = torch.cat([batch.detach().cpu() for batch in predictions])
    return ProgramRun(calls=run.calls, values=values, results=run.results, numbers=numbers)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_two_ranks_log_and_train_as_one_process(runs, name, strategy):
    # Every step logged: the step values in callback_metrics are then the reduced ones on every rank
    # (between logging steps each rank shows its own, by design: no collective on those steps).
    one = _comparable(runs.get(name, "ours", every_step_logged=True))
    two = _comparable(runs.get(name, "ours", devices=2, strategy=strategy, every_step_logged=True))
    assert_same_values(one, two, RTOL, skip=BY_NATURE)
    assert_same_numbers(one, two, RTOL, ATOL, skip=PROCESS_LOCAL + tuple("fit/" + name for name in BY_NATURE))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", PROGRAMS)
def test_rank_zero_calls_the_hooks_one_process_calls(runs, name, strategy):
    assert_same_calls(_without_evaluation_batch_index(runs.get(name, "ours")),
                      _without_evaluation_batch_index(runs.get(name, "ours", devices=2, strategy=strategy)))


def _without_evaluation_batch_index(run: ProgramRun) -> ProgramRun:
    """``run`` without the ``batch_idx`` of test / predict batches: by design the batch's index in the
    whole set (rank r of W runs batches r, r + W, ...), so rank 0's differ from one process's."""
    def kept(hook, arguments):
        return {k: v for k, v in arguments.items() if not (k == "batch_idx" and ("test" in hook or "predict" in hook))}
    return ProgramRun(calls=[(role, hook, kept(hook, arguments)) for role, hook, arguments in run.calls],
                      values=run.values, results=run.results, numbers=run.numbers)
