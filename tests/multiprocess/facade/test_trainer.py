"""Trainer behaviour: token normalisation, exact validation metrics, hooks, schedulers, bad input."""

import json
import math

import pytest
import torch

from tests.support.helpers import MismatchedMetrics, PrepareDataRecorder, Regressor, VariableLengthTokens, fit, read_metrics
from trainer import Trainer
from trainer.runtime.launch import WorkerFailed
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(240)
TOL = dict(rtol=1e-5, atol=1e-6)


def assert_params_close(a: dict, b: dict):
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=f"parameter {name} differs")


def test_token_normalisation_is_exact_across_splits(tmp_path):
    # Batches hold different numbers of valid tokens, so a mean of per-micro-batch means would
    # differ from the global token mean; token normalisation must make all splits agree.
    common = dict(max_steps=4, loss_normalization="tokens")
    big = fit(tmp_path / "big", VariableLengthTokens(), batch_size=8, **common)
    accumulated = fit(tmp_path / "acc", VariableLengthTokens(), batch_size=2, accumulate_grad_batches=4, **common)
    ddp = fit(tmp_path / "ddp", VariableLengthTokens(), strategy="ddp", devices=2, batch_size=2, accumulate_grad_batches=2, **common)
    # 2 stages, 4 microbatches of 2 sequences: the token sums cross the pipeline's microbatches
    pipeline = fit(tmp_path / "pp", VariableLengthTokens(), strategy=PipelineStrategy(microbatches=4), devices=2,
                   batch_size=8, **common)
    for other in (accumulated, ddp, pipeline):
        torch.testing.assert_close(torch.tensor(other[0]), torch.tensor(big[0]), **TOL)
        assert_params_close(other[1], big[1])
    # Sample normalisation weights micro-batches by samples, not tokens: a different training.
    by_samples = fit(tmp_path / "samples", VariableLengthTokens(), batch_size=2, accumulate_grad_batches=4, max_steps=4)
    assert not torch.allclose(by_samples[1]["head.weight"], big[1]["head.weight"], **TOL)
    # (a clean exit of each strategy: tests/multiprocess/strategies/test_clean_exit.py, which reads the
    # ranks' own stderr; workers forked by the test session's fork server write elsewhere than capfd)


def test_validation_metrics_are_exact_means_without_duplicates(tmp_path):
    # 13 validation samples on 2 ranks with batch 4: uneven shards, no padding.
    single = fit(tmp_path / "single", Regressor(val_samples=13), batch_size=4, max_steps=2)
    ddp = fit(tmp_path / "ddp", PrepareDataRecorder(val_samples=13), strategy="ddp", devices=2, batch_size=2, max_steps=2)
    val = lambda run: [r["val/loss"] for r in read_metrics(str(tmp_path / run)) if "val/loss" in r]  # noqa: E731
    assert len(val("single")) == 1
    torch.testing.assert_close(torch.tensor(val("ddp")), torch.tensor(val("single")), **TOL)
    # And the reported value is the plain mean over the 13 samples, computed here by hand.
    from tests.support.helpers import regression_data

    module = Regressor()
    module.net.load_state_dict(single[1])
    x, y = regression_data(13, seed=8).tensors
    expected = torch.nn.functional.mse_loss(module.net(x), y).item()
    assert val("single")[0] == pytest.approx(expected, rel=1e-6)
    # prepare_data ran once (local rank 0 of the one node).
    prepared = (tmp_path / "ddp" / "prepared").read_text().split("\n")
    assert [line.split()[0] for line in prepared if line] == ["0"]


def test_mismatched_metric_keys_fail_with_a_message_not_a_hang(tmp_path):
    with pytest.raises(WorkerFailed, match="different train metric keys.*extra"):
        fit(tmp_path, MismatchedMetrics(), strategy="ddp", devices=2, batch_size=8, max_steps=2, collective_timeout_s=30)


def test_scheduler_steps_once_per_optimizer_step(tmp_path):
    from functools import partial

    from trainer.optim.schedules import warmup_cosine

    module = Regressor()
    module.scheduler_factory = partial(warmup_cosine, warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    fit(tmp_path, module, batch_size=4, accumulate_grad_batches=3, max_steps=6)
    lrs = [r["train/lr"] for r in read_metrics(str(tmp_path)) if "train/lr" in r]
    # The LR logged after step k is the one the next step uses: factor(k).
    def factor(step):
        if step < 2:
            return (step + 1) / 2
        progress = min(1.0, (step - 2) / 4)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    assert lrs == pytest.approx([0.05 * factor(k) for k in range(1, 7)])


def test_max_epochs_and_metrics_contract(tmp_path):
    fit(tmp_path, Regressor(num_samples=40), batch_size=16, max_steps=-1, max_epochs=2)
    records = read_metrics(str(tmp_path))
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]  # 3 steps per epoch (16 + 16 + 8)
    assert [r["epoch"] for r in train] == [0, 0, 0, 1, 1, 1]
    assert all(isinstance(r["train/loss"], float) for r in train)


@pytest.mark.parametrize(
    "args,message",
    [
        (dict(devices=0), "trainer.devices must be an integer >= 1, got 0"),
        (dict(accumulate_grad_batches=0), "accumulate_grad_batches must be an integer >= 1, got 0"),
        (dict(batch_size=0), "data.batch_size must be an integer >= 1, got 0"),
        (dict(strategy="nope"), "unknown strategy 'nope'; available: ddp, fsdp, nd, pipeline, single"),
        (dict(strategy="ddp", devices=2, batch_size=32, global_batch_size=30), "global_batch_size=30 is not a multiple"),
        (dict(loss_normalization="words"), "loss_normalization='words' is not one of"),
        (dict(max_steps=0), "max_steps must be -1 or >= 1, got 0"),
    ],
)
def test_bad_arguments_name_the_value(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(**args)


def test_global_batch_size_sets_accumulation():
    trainer = Trainer(strategy="ddp", devices=2, batch_size=4, global_batch_size=32)
    assert trainer.accumulate_grad_batches == 4


def test_multi_node_without_a_launcher_is_refused_before_spawning(tmp_path):
    with pytest.raises(ValueError, match="num_nodes=2 needs a multi-node launcher"):
        Trainer(strategy="ddp", devices=1, num_nodes=2, run_dir=str(tmp_path)).fit(Regressor())
    assert not any(tmp_path.iterdir())
