"""The global-batch-invariant plan: every sample once per epoch, same batches for any split."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO
import torch

from trainer.data.batch_plan import GlobalBatchPlan, validation_shard
from trainer.data.permutation import IndexPermutation


def samples_of_step(plan: GlobalBatchPlan, epoch: int, step: int) -> list[int]:
    """The union over ranks and micro-steps of what step ``step`` loads (real samples only)."""
    seen = []
    for rank in range(plan.world_size):
        for micro_batch in plan.step_plan(epoch, step, rank).micro_batches:
            seen.extend(micro_batch.indices[: micro_batch.num_real])
    return seen


@pytest.mark.parametrize("num_samples", [64, 70, 5])
@pytest.mark.parametrize("world_size,batch,accumulate", [(1, 8, 1), (2, 4, 1), (2, 2, 2), (4, 1, 2)])
def test_every_sample_exactly_once_per_epoch(num_samples, world_size, batch, accumulate):
    plan = GlobalBatchPlan(num_samples, batch, accumulate, world_size, seed=3)
    for epoch in range(2):
        seen = list(itertools.chain.from_iterable(samples_of_step(plan, epoch, s) for s in range(plan.steps_per_epoch)))
        assert sorted(seen) == list(range(num_samples))


@pytest.mark.parametrize("world_size,batch,accumulate", [(2, 8, 1), (2, 2, 4), (4, 4, 1), (1, 4, 4), (4, 1, 4)])
def test_global_batch_is_the_same_whatever_the_split(world_size, batch, accumulate):
    reference = GlobalBatchPlan(70, 16, 1, 1, seed=11)
    plan = GlobalBatchPlan(70, batch, accumulate, world_size, seed=11)
    assert plan.steps_per_epoch == reference.steps_per_epoch == 5  # 4 full batches + a short one of 6
    for epoch, step in itertools.product(range(2), range(plan.steps_per_epoch)):
        assert sorted(samples_of_step(plan, epoch, step)) == sorted(samples_of_step(reference, epoch, step))
        assert sum(sum(mb.num_real for mb in plan.step_plan(epoch, step, r).micro_batches) for r in range(world_size)) \
            == plan.step_plan(epoch, step, 0).global_count


def test_order_changes_per_epoch_and_repeats_with_the_seed():
    plan = GlobalBatchPlan(100, 10, 1, 1, seed=5)
    assert plan.epoch_order(0) != plan.epoch_order(1)
    assert plan.epoch_order(0) == GlobalBatchPlan(100, 5, 2, 1, seed=5).epoch_order(0)
    assert plan.epoch_order(0) != GlobalBatchPlan(100, 10, 1, 1, seed=6).epoch_order(0)


def test_every_rank_runs_the_same_number_of_micro_batches():
    # A short last window (6 samples on 4 ranks x 2 micro-steps of 2) must not leave a rank with
    # fewer forward/backward passes than the others, or the gradient all-reduce would hang.
    plan = GlobalBatchPlan(70, 2, 2, 4, seed=0)
    for step in range(plan.steps_per_epoch):
        counts = {len(plan.step_plan(0, step, r).micro_batches) for r in range(4)}
        assert len(counts) == 1


@pytest.mark.parametrize("num_samples, batch, accumulate, world_size", [(70, 2, 2, 4), (64, 8, 1, 1), (64, 4, 2, 1),
                                                                         (96, 4, 3, 2), (10, 1, 1, 3)])
def test_full_global_batches_take_the_short_deal_with_the_same_result(num_samples, batch, accumulate, world_size):
    """step_plan deals a full global batch by slicing (the per-step short way); it must give what
    layout() deals, cell for cell, on every rank and step (the last, short one goes through layout)."""
    plan = GlobalBatchPlan(num_samples, batch, accumulate, world_size, seed=2)
    short_steps = 0
    for step in range(plan.steps_per_epoch):
        samples = plan.global_batch(0, step)
        short_steps += len(samples) != plan.global_batch_size
        rows = plan.layout(samples)
        for rank in range(world_size):
            dealt = plan.step_plan(0, step, rank)
            assert [m.indices for m in dealt.micro_batches] == [tuple(row[rank]) or (samples[0],) for row in rows]
            assert [m.num_real for m in dealt.micro_batches] == [len(row[rank]) for row in rows]
            assert dealt.global_count == len(samples)
    assert plan.steps_per_epoch - short_steps >= 1


def test_fewer_samples_than_ranks_pads_with_zero_weight():
    plan = GlobalBatchPlan(3, 1, 1, 4, seed=0)
    steps = [plan.step_plan(0, 0, r) for r in range(4)]
    assert [s.micro_batches[0].num_real for s in steps] == [1, 1, 1, 0]
    assert all(len(s.micro_batches[0].indices) == 1 for s in steps)  # the padded rank still loads a sample


def test_drop_last_and_too_small_dataset():
    assert GlobalBatchPlan(70, 16, 1, 1, seed=0, drop_last=True).steps_per_epoch == 4
    with pytest.raises(ValueError, match="fewer than one global batch"):
        GlobalBatchPlan(10, 8, 1, 2, seed=0, drop_last=True)
    with pytest.raises(ValueError, match="accumulate must be >= 1, got 0"):
        GlobalBatchPlan(10, 8, 0, 2, seed=0)


@pytest.mark.parametrize("num_samples,world_size", [(10, 3), (2, 4), (17, 2)])
def test_validation_shards_cover_every_sample_once_without_padding(num_samples, world_size):
    shards = [validation_shard(num_samples, 4, r, world_size) for r in range(world_size)]
    flat = [i for shard in shards for batch in shard for i in batch]
    assert sorted(flat) == list(range(num_samples))
    for rank, shard in enumerate(shards):  # the batches the eager lists of before gave, and their sizes
        mine = list(range(rank, num_samples, world_size))
        assert list(shard) == [mine[i:i + 4] for i in range(0, len(mine), 4)]
        assert list(shard.sizes()) == [len(batch) for batch in shard]
        assert list(shard.padded(len(shard) + 2)) == list(shard) + [[0], [0]]


def test_a_validation_shard_of_1e8_samples_is_built_lazily():
    # O(batch) per batch, nothing per sample up front: the last batch of rank 1 of 2 without a list of 5e7.
    shard = validation_shard(10**8, 4, 1, 2)
    assert len(shard) == 12_500_000
    assert shard[-1] == [99_999_993, 99_999_995, 99_999_997, 99_999_999]


# ----- the permutation and the lazy plan (O(global batch) per step, O(1) per rank in the dataset size)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 17, 100, 1000, 1025])
def test_permutation_is_a_bijection(n):
    for key in range(4):
        permutation = IndexPermutation(n, key)
        order = permutation.range(0, n).tolist()
        assert sorted(order) == list(range(n))
        assert order == [permutation.at(i) for i in range(n)]  # tensor ops and Python ints agree


def test_permutation_mixes_and_depends_on_the_key():
    n = 10_000
    order = IndexPermutation(n, 7).range(0, n)
    steps = (order[1:] - order[:-1]).abs()
    assert (steps == 1).sum() < 20  # a random order has ~2 adjacent neighbours in 10_000
    assert (order == torch.arange(n)).sum() < 20  # ~1 fixed point expected
    assert abs(torch.corrcoef(torch.stack([order.double(), torch.arange(n).double()]))[0, 1]) < 0.05
    # Each position is spread over the whole range: where the first 10 samples land, by decile.
    first_decile = torch.stack([IndexPermutation(n, k).range(0, 10) for k in range(200)]) * 10 // n
    assert torch.bincount(first_decile.flatten(), minlength=10).min() > 120  # 200 expected per decile
    assert not torch.equal(order, IndexPermutation(n, 8).range(0, n))
    assert torch.equal(IndexPermutation(n, 7)[torch.tensor([5, 9_999, 0])], order[[5, 9_999, 0]])


def test_shuffle_false_is_dataset_order():
    plan = GlobalBatchPlan(10, 2, 2, 2, seed=0, shuffle=False)
    assert plan.global_batch(0, 0) == [0, 1, 2, 3, 4, 5, 6, 7] and plan.global_batch(3, 1) == [8, 9]
    assert [mb.indices for mb in plan.step_plan(0, 0, 1).micro_batches] == [(2, 3), (6, 7)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_steps_are_lazy_and_start_anywhere(drop_last):
    plan = GlobalBatchPlan(70, 2, 2, 4, seed=1, drop_last=drop_last)
    for rank, start in itertools.product(range(4), (0, 3, plan.steps_per_epoch)):
        steps = plan.rank_steps(1, rank, start)
        assert not isinstance(steps, (list, tuple))
        assert list(steps) == [plan.step_plan(1, s, rank) for s in range(start, plan.steps_per_epoch)]
        batches = plan.rank_batches(1, rank, start)
        assert list(batches) == [mb.indices for s in plan.rank_steps(1, rank, start) for mb in s.micro_batches]
        assert len(batches) == len(list(batches))  # iterable again, and its length is computed, not drawn


_PLAN_MEMORY = """
import json, resource, time
import torch
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
baseline = peak()  # after import torch
from trainer.data.batch_plan import GlobalBatchPlan
from trainer.data.loaders import LoaderOptions, build_loader
class Big(torch.utils.data.Dataset):
    def __len__(self): return 10**8
    def __getitem__(self, i): return torch.tensor([i])
out = {}
for rank in range(2):  # two ranks' plans in one process: each rank's growth is at most the total
    started = time.perf_counter()
    plan = GlobalBatchPlan(10**8, 64, 2, 2, seed=0)
    first = next(plan.rank_steps(0, rank))
    out.setdefault("first_step_s", []).append(time.perf_counter() - started)
    late = next(plan.rank_steps(3, rank, plan.steps_per_epoch - 1))  # a resume near the end of an epoch
    batch = next(iter(build_loader(Big(), plan.rank_batches(0, rank), torch.utils.data.default_collate,
                                   LoaderOptions(), seed=0)))
    assert batch.shape == (64, 1) and batch.flatten().tolist() == list(first.micro_batches[0].indices)
    steps = plan.rank_steps(1, rank)
    for _ in range(50):
        next(steps)
    out.setdefault("growth_bytes", []).append(peak() - baseline)
print(json.dumps(out))
"""


def test_plan_for_1e8_samples_costs_little_memory_per_rank():
    # Before: every rank built randperm(1e8).tolist() (~4 GB) and every StepPlan of the epoch.
    # Measured in a fresh process as the growth of peak RSS over its `import torch` baseline.
    result = subprocess.run([sys.executable, "-c", _PLAN_MEMORY], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    assert max(measured["growth_bytes"]) < 100 * 2**20, measured
    assert max(measured["first_step_s"]) < 2.0, measured  # generous: O(global batch), ~5 ms here


def test_the_plan_reads_no_scalar_from_a_tensor():
    # A host-sync counter (aten._local_scalar_dense) wraps whole runs: the plan must not add to it.
    class Reads(torch.utils._python_dispatch.TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Reads.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    plan = GlobalBatchPlan(200, 8, 2, 2, seed=4)  # 200 < 256: positions cycle-walk
    with Reads():
        steps = list(plan.rank_steps(0, 1))
    assert Reads.count == 0 and len(steps) == plan.steps_per_epoch
