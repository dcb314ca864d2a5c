"""The late non-finite loss check, checked per window of steps on the device: it names the first bad
step (and its epoch) whatever the windows' boundaries, the micro-batches per step, the epochs and the
settle points, and under fp16 (``nan_only``) an infinite loss is not an error."""

import itertools
import random

import pytest
import torch

from trainer.loop.step_accounting import NonfiniteLossWatch

INF, NAN = float("inf"), float("nan")


def _first_bad(steps, nan_only):
    """The reference: the first (step, epoch) with a bad loss, straight from the values."""
    for step, epoch, losses in steps:
        if any(v != v or (not nan_only and abs(v) == INF) for v in losses):
            return step, epoch
    return None


def _watched(steps, nan_only, settle_at):
    watch = NonfiniteLossWatch(torch.device("cpu"), nan_only=nan_only)
    for step, epoch, losses in steps:
        for value in losses:
            watch.observe(torch.tensor(value))
        watch.end_step(step, epoch)
        if step in settle_at or step == steps[-1][0]:
            try:
                watch.settle(rank=0, now=step)
            except FloatingPointError as error:
                return error
    return None


def _run(seed):
    """Up to 300 steps over epochs of 70, 1 to 3 micro-batches per step (or none), a rare bad value."""
    rng = random.Random(seed)
    per_step = rng.choice([1, 2, 3, None])  # None: it varies step by step
    steps = []
    for step in range(1, rng.randint(2, 300)):
        count = per_step or rng.randint(0, 3)
        losses = [rng.choice([INF, -INF, NAN]) if rng.random() < 0.004 else rng.random() for _ in range(count)]
        steps.append((step, (step - 1) // 70, losses))
    settle_at = set(rng.sample(range(1, 300), rng.randint(0, 8)))
    return steps, settle_at


@pytest.mark.parametrize("seed, nan_only", list(itertools.product(range(40), [False, True])))
def test_the_first_bad_step_is_named_whatever_the_windows(seed, nan_only):
    steps, settle_at = _run(seed)
    expected = _first_bad(steps, nan_only)
    error = _watched(steps, nan_only, settle_at)
    if expected is None:
        assert error is None
    else:
        assert error is not None and f"non-finite training loss at step {expected[0]} (epoch {expected[1]})" in str(error)


def test_a_bad_step_past_a_full_window_and_across_an_epoch_end():
    steps = [(s, 0 if s <= 100 else 1, [1.0, NAN if s == 130 else 2.0]) for s in range(1, 200)]
    assert "at step 130 (epoch 1)" in str(_watched(steps, nan_only=False, settle_at=set()))
    steps = [(s, 0, [INF if s == 64 else 1.0]) for s in range(1, 130)]  # the last step of the first window
    assert "at step 64 (epoch 0)" in str(_watched(steps, nan_only=False, settle_at=set()))
    assert _watched(steps, nan_only=True, settle_at=set()) is None
