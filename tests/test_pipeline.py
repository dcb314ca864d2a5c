"""Pipeline parallel (``strategy=pipeline``) computes the same training as one process.

Tolerance: CPU fp32, AdamW, rtol=1e-5 / atol=1e-6 over 15 steps (the gradients are summed per
microbatch instead of over the whole batch at once, which reorders float additions).
"""

import pytest
import torch

from helpers import BlockRegressor, fit, read_metrics
from trainer.strategies.pipeline import PipelineStrategy, partition_layers

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 15
GLOBAL_BATCH = 16


def assert_same_training(a, b):
    losses_a, params_a = a
    losses_b, params_b = b
    assert len(losses_a) == len(losses_b) == STEPS
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), **TOL)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], **TOL, msg=f"parameter {name} differs")


def run(path, strategy="single", devices=1, batch_size=GLOBAL_BATCH, **options):
    module = BlockRegressor(depth=4, val_samples=20)
    return fit(path, module, strategy=strategy, devices=devices, batch_size=batch_size, max_steps=STEPS,
               val_every_n_steps=5, **options)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    return run(path), path


def val_losses(path):
    return [r["val/loss"] for r in read_metrics(str(path)) if "val/loss" in r]


def test_partition():
    assert partition_layers([1] * 6, 2, "uniform") == [0, 3, 6]
    assert partition_layers([1] * 5, 2, "uniform") == [0, 3, 5]
    assert partition_layers([10, 1, 1, 1, 10], 2, "parameters") == [0, 2, 5]
    assert partition_layers([1, 1, 100, 1], 3, "parameters") == [0, 2, 3, 4]
    assert partition_layers([1] * 6, 3, [1, 4]) == [0, 1, 4, 6]
    with pytest.raises(ValueError, match="fewer than the 4 stages"):
        partition_layers([1] * 3, 4, "uniform")
    with pytest.raises(ValueError, match=r"strategy.partition=\[4, 2\]"):
        partition_layers([1] * 6, 3, [4, 2])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_equal_one_process(single, tmp_path, schedule):
    piped = run(tmp_path, PipelineStrategy(schedule=schedule, microbatches=4), devices=2)
    assert_same_training(piped, single[0])
    # validation (every 5 steps, 20 samples: a short last batch padded inside the pipeline)
    assert len(val_losses(tmp_path)) == 3
    torch.testing.assert_close(torch.tensor(val_losses(tmp_path)), torch.tensor(val_losses(single[1])), **TOL)


def test_interleaved_equals_one_process(single, tmp_path):
    strategy = PipelineStrategy(schedule="interleaved_1f1b", microbatches=4, partition="uniform")
    assert_same_training(run(tmp_path, strategy, devices=2), single[0])


def test_pipeline_by_data_parallel_equals_one_process(single, tmp_path):
    strategy = PipelineStrategy(stages=2, schedule="1f1b", microbatches=2)
    assert_same_training(run(tmp_path, strategy, devices=4, batch_size=GLOBAL_BATCH // 2), single[0])
