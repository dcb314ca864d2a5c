"""Speed metrics: FLOPs and MFU, throughput, peak memory, the wall-clock breakdown, profiler traces."""

import functools
import os

import pytest
import torch

from tests.support.helpers import BlockRegressor, fit, read_metrics, run_trainer
from trainer.recipes.gpt import GPTModule
from trainer.observe.throughput import Throughput, peak_tflops

pytestmark = pytest.mark.timeout(300)
LAYERS, WIDTH, BLOCK, BATCH = 2, 64, 32, 8


def gpt_run(run_dir, **options):
    module = GPTModule(optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), max_bytes=40_000,
                       block_size=BLOCK, layers=LAYERS, heads=2, width=WIDTH)
    run_trainer(run_dir, module, batch_size=BATCH, max_steps=3, **options)
    rows = [r for r in read_metrics(str(run_dir)) if "perf/step_time_s" in r]
    return module, rows


def test_counted_flops_match_6n_plus_attention(tmp_path):
    # Per step: 6 N tokens (N = the matmul weights: attention, MLP, head) + 12 L T d tokens
    # (attention scores and values, forward and backward), tokens = batch x context.
    module, rows = gpt_run(tmp_path, accumulate_grad_batches=2)
    n = sum(p.numel() for name, p in module.named_parameters() if "embedding" not in name and p.dim() == 2)
    tokens = BATCH * 2 * BLOCK
    expected = 6 * n * tokens + 12 * LAYERS * BLOCK * WIDTH * tokens
    for row in rows:
        counted = row["perf/tflops_per_device"] * 1e12 * row["perf/step_time_s"]  # FLOPs per step
        assert counted == pytest.approx(expected, rel=0.03)


def test_throughput_metrics_are_consistent(tmp_path):
    _, rows = gpt_run(tmp_path)
    for row in rows:
        # Every sample is BLOCK tokens; samples/s x step time = the global batch.
        assert row["perf/tokens_per_s"] == pytest.approx(row["perf/samples_per_s"] * BLOCK, rel=1e-9)
        assert row["perf/samples_per_s"] * row["perf/step_time_s"] == pytest.approx(BATCH, rel=1e-9)
        assert row["memory/peak_rss_gb"] > 0.05
        assert "perf/mfu" not in row  # no peak FLOP/s known for a CPU: stated as unknown, not guessed


def test_mfu_divides_by_the_device_peak():
    assert peak_tflops(torch.device("cpu"), sixteen_bit=True) is None
    meter = Throughput(torch.device("cpu"), world_size=2, sixteen_bit=True)
    meter.peak = 100.0  # as if the table knew this device: 100 TFLOP/s
    meter.set_flops_per_micro_batch(10**12, micro_batches_per_step=2)  # 2e12 per rank-step, 4e12 global
    meter.step(global_samples=16)
    metrics = meter.metrics(global_tokens=None)
    achieved = 4e12 / metrics["perf/step_time_s"] / 2 / 1e12
    assert metrics["perf/tflops_per_device"] == pytest.approx(achieved)
    assert metrics["perf/mfu"] == pytest.approx(achieved / 100.0)


def test_wall_clock_breakdown_adds_up_to_the_step_time(tmp_path):
    fit(tmp_path, BlockRegressor(width=384, depth=4), strategy="ddp", devices=2, batch_size=64, max_steps=6,
        accumulate_grad_batches=2, profile={"wall_clock_breakdown": True})
    rows = [r for r in read_metrics(str(tmp_path)) if "time/step_ms" in r]
    assert len(rows) == 6
    for row in rows:
        parts = sum(row[f"time/{p}_ms"] for p in ("data", "forward", "backward", "optimizer", "collectives"))
        # The parts are timed inside the step, so they never exceed it; the rest is the loop's own time,
        # which a loaded 2-core machine stretches past 10% now and then (CI saw 29.6 of 33.0 ms): the
        # parts must cover most of the step, not a timed 10% band.
        assert parts <= row["time/step_ms"] * 1.01
        assert parts >= 0.6 * row["time/step_ms"]
        assert row["time/forward_ms"] > 0 and row["time/backward_ms"] > 0


def test_profiler_trace_and_summary(tmp_path):
    fit(tmp_path, BlockRegressor(), batch_size=16, max_steps=5, profile={"trace_steps": [2, 3]})
    files = os.listdir(tmp_path / "profiler")
    assert any(f.startswith("rank0") and f.endswith(".pt.trace.json") for f in files), files
    summary = (tmp_path / "profiler" / "summary_rank0.txt").read_text()
    assert "steps 2..3" in summary and "aten::addmm" in summary and "FLOPs" in summary


def test_bad_trace_steps():
    from trainer import Trainer

    with pytest.raises(ValueError, match=r"trainer.profile.trace_steps=\[5, 2\]"):
        Trainer(profile={"trace_steps": [5, 2]})
