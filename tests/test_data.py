"""The global-batch-invariant plan: every sample once per epoch, same batches for any split."""

import itertools

import pytest

from trainer.data import GlobalBatchPlan, validation_shard


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
