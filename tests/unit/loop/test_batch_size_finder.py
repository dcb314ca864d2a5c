"""The batch-size finder (``trainer.auto_batch_size``, trainer/loop/batch_size_finder.py): its memory meter,
its search, the run after it, the global-batch rule, the refusals, and 2 DDP ranks agreeing."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from tests.support.helpers import BatchSizeReporter, Regressor, fit, new_trainer, train_losses
from trainer.loop.batch_size_finder import GIB, candidates_dividing, search
from trainer.runtime.peak_memory import TensorMemoryPeak
from trainer.strategies.pipeline import PipelineStrategy

MB = 10**6


def test_peak_meter_counts_live_tensor_bytes_of_a_known_pattern():
    resident = torch.zeros(1000)  # 4000 bytes that exist before the block
    with TensorMemoryPeak([resident]) as meter:
        a = torch.empty(MB // 4)  # 1 MB
        b = torch.empty(MB // 2)  # 2 MB: 3 MB + 4000 live
        view = b[10:]  # a view: no new memory
        b.add_(1)  # in place: no new memory
        del a  # 2 MB + 4000 live
        c = torch.empty(MB // 8)  # 0.5 MB: 2.5 MB + 4000 live, below the peak
        assert (meter.peak, meter.current) == (3 * MB + 4000, 5 * MB // 2 + 4000)
        del b, c
        assert meter.current == 2 * MB + 4000  # b's storage lives on in its view
        del view
        assert meter.current == 4000
    assert meter.peak == 3 * MB + 4000


def test_search_grows_by_powers_of_two_then_bisects():
    tried = []

    def fits(size):
        tried.append(size)
        return size <= 37

    assert search(2, 1000, None, fits) == 37
    assert tried == [2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    tried.clear()
    assert search(100, 1000, None, fits) == 37  # a start over the budget is halved until one fits
    assert tried[:3] == [100, 50, 25]
    assert search(4, 20, None, lambda size: True) == 20  # bounded by the data / auto_batch_size_max
    assert search(4, 20, None, lambda size: False) is None  # not even 1 fits


def test_search_with_a_global_batch_tries_only_its_divisors():
    allowed = candidates_dividing(48, 1000)
    assert allowed == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    tried = []

    def fits(size):
        tried.append(size)
        return size <= 20

    assert search(2, 1000, allowed, fits) == 16
    assert all(48 % size == 0 for size in tried)
    assert candidates_dividing(48, 10) == [1, 2, 3, 4, 6, 8]  # auto_batch_size_max bounds them


class DropoutRegressor(Regressor):
    """Regressor with dropout and AdamW: the finder's trials must put back the random generators and
    the optimizer state (AdamW creates it in the first step) for the run to equal one without them."""

    def __init__(self):
        super().__init__(optimizer="adamw", lr=0.01)
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 32), nn.Dropout(0.3), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)


def _local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_run_after_the_finder_equals_a_run_started_with_the_chosen_size(tmp_path, caplog, strategy):
    limit_gb = 60e3 / GIB  # about 60 kB of tensors: a micro-batch of some tens of the 200 samples
    common = dict(max_steps=6, num_sanity_val_steps=0, strategy=strategy)  # fsdp: one rank, DTensor shards
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer = new_trainer(tmp_path / "auto", batch_size=2, auto_batch_size=True, auto_batch_size_limit_gb=limit_gb,
                              **common)
        auto = DropoutRegressor()
        trainer.fit(auto)
    chosen = trainer.batch_size
    assert 2 < chosen < 200
    assert trainer.global_batch_size == chosen  # data.global_batch_size unset: the global batch follows
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("auto_batch_size:"))
    assert f"micro-batch {chosen} per rank (was 2)" in line and "the global batch follows the micro-batch" in line
    assert "margin 0.1" in line and ", over)" in line  # the trials, a miss among them, and the margin
    assert f"2 -> {chosen} (batch x accumulate 1 x 1 ranks), {-(-200 // chosen)} steps per epoch" in line
    losses, params = fit(tmp_path / "fixed", DropoutRegressor(), batch_size=chosen, **common)
    torch.testing.assert_close(train_losses(str(tmp_path / "auto")), losses, rtol=0, atol=1e-6)
    auto_params = torch.load(os.path.join(tmp_path / "auto", "params.pt"))
    for name, value in params.items():
        torch.testing.assert_close(_local(auto_params[name]), _local(value), rtol=0, atol=1e-6)


def test_with_a_global_batch_the_choice_divides_it_and_accumulation_keeps_it(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer = new_trainer(tmp_path, batch_size=2, global_batch_size=48, auto_batch_size=True,
                              auto_batch_size_limit_gb=1.0, auto_batch_size_max=20, max_steps=2, num_sanity_val_steps=0)
        trainer.fit(BatchSizeReporter())
    # Everything fits 1 GiB: the largest divisor of 48 up to the max of 20.
    assert (trainer.batch_size, trainer.accumulate_grad_batches, trainer.global_batch_size) == (16, 3, 48)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("auto_batch_size:"))
    assert "data.global_batch_size=48 kept: accumulate_grad_batches 24 -> 3" in line
    report = json.load(open(tmp_path / "batch_size_rank0.json"))
    assert report["seen"] == [2, 2, 4, 4, 8, 8, 16, 16] + [16] * 6  # the trials (2 steps each), then 2 x 3 micro-batches


def test_refusals_and_bad_settings_name_the_value():
    with pytest.raises(ValueError, match=r"auto_batch_size=true is not supported with strategy=pipeline: it runs each "
                                         r"micro-batch through its stages itself"):
        new_trainer("unused", strategy=PipelineStrategy(), devices=2, auto_batch_size=True, auto_batch_size_limit_gb=1)
    with pytest.raises(ValueError, match=r"auto_batch_size=true on CPU needs trainer.auto_batch_size_limit_gb"):
        new_trainer("unused", auto_batch_size=True, accelerator="cpu")
    with pytest.raises(ValueError, match=r"trainer.auto_batch_size_margin must be a fraction in \[0, 1\), got 1.5"):
        new_trainer("unused", auto_batch_size=True, auto_batch_size_limit_gb=1, auto_batch_size_margin=1.5)
    with pytest.raises(ValueError, match=r"trainer.auto_batch_size_max must be an integer >= 1 or null, got 0"):
        new_trainer("unused", auto_batch_size=True, auto_batch_size_limit_gb=1, auto_batch_size_max=0)
    with pytest.raises(ValueError, match=r"trainer.auto_batch_size must be true or false, got 'yes'"):
        new_trainer("unused", auto_batch_size="yes")


class ManualRegressor(Regressor):
    automatic_optimization = False


def test_manual_optimization_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"auto_batch_size=true with manual optimization \(automatic_optimization = "
                                         r"False\): a trial step cannot call your training_step's own optimizer steps"):
        new_trainer(tmp_path, auto_batch_size=True, auto_batch_size_limit_gb=1).fit(ManualRegressor())


class SkipsFirstBatch(Regressor):
    def training_step(self, batch, batch_idx):
        return None if batch_idx == 0 else super().training_step(batch, batch_idx)


def test_a_trial_step_without_a_loss_says_why_the_finder_needs_one(tmp_path):
    # (training skips such a batch; the trial measures a backward, so it asks for a loss)
    with pytest.raises(ValueError, match=r"training_step returned no loss in the batch-size finder's trial step "
                                         r"\(batch_idx 0, \d+ samples\), which measures the memory of a forward and "
                                         r"backward: return a loss for it .* or set the batch size yourself"):
        new_trainer(tmp_path, auto_batch_size=True, auto_batch_size_limit_gb=1).fit(SkipsFirstBatch())


def test_no_size_fits_is_an_error_naming_the_budget(tmp_path):
    with pytest.raises(ValueError, match=r"no micro-batch fits the budget \(peak <= limit 100 B x \(1 - margin 0.1\)"):
        new_trainer(tmp_path, auto_batch_size=True, auto_batch_size_limit_gb=100 / GIB).fit(Regressor())


def _one_sample_peak() -> tuple[float, float]:
    """The measured peak of one Regressor training step on one sample and its growth per sample."""
    peaks = []
    for size in (1, 9):
        module = Regressor()
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(size, 6), torch.randn(size, 1)
        with TensorMemoryPeak([*module.parameters()]) as meter:
            F.mse_loss(module(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peaks.append(meter.peak)
    return peaks[0], (peaks[1] - peaks[0]) / 8


@pytest.mark.slow
def test_two_ddp_ranks_pick_the_same_size_and_train_with_it(tmp_path):
    one, per_sample = _one_sample_peak()
    limit = (one + 30 * per_sample) / 0.9  # some tens of samples fit (DDP's buckets take a little more)
    trainer = new_trainer(tmp_path, strategy="ddp", devices=2, batch_size=1, auto_batch_size=True,
                          auto_batch_size_limit_gb=limit / GIB, max_steps=3, num_sanity_val_steps=0)
    trainer.fit(BatchSizeReporter())
    reports = [json.load(open(tmp_path / f"batch_size_rank{rank}.json")) for rank in (0, 1)]
    chosen = reports[0]["batch_size"]
    assert 1 < chosen < 100 and reports[1]["batch_size"] == chosen  # both ranks report the same choice
    for report in reports:  # and train on it (after the trials' sizes)
        assert report["seen"][-3:] == [chosen] * 3 and chosen in report["seen"][:-3]


def test_a_resumed_run_finds_the_same_size_and_continues_exactly(tmp_path):
    # The trials run two steps each, so the optimizer state a resumed run already holds is measured in
    # a fresh run too: both choose alike, and with data.global_batch_size the resumed run is exact.
    common = dict(batch_size=2, global_batch_size=48, auto_batch_size=True, auto_batch_size_limit_gb=7e3 / GIB,
                  num_sanity_val_steps=0, checkpoint={"dir": str(tmp_path / "ckpt")})
    whole = new_trainer(tmp_path / "whole", max_steps=4, **{**common, "checkpoint": None})
    whole.fit(Regressor(optimizer="adamw", lr=0.01))
    new_trainer(tmp_path / "first", max_steps=2, **common).fit(Regressor(optimizer="adamw", lr=0.01))
    resumed = new_trainer(tmp_path / "rest", max_steps=4, resume="auto", **common)
    resumed.fit(Regressor(optimizer="adamw", lr=0.01))
    assert 2 < resumed.batch_size == whole.batch_size < 48
    assert train_losses(str(tmp_path / "first")) + train_losses(str(tmp_path / "rest")) == train_losses(str(tmp_path / "whole"))
    expected, got = torch.load(tmp_path / "whole" / "params.pt"), torch.load(tmp_path / "rest" / "params.pt")
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0)


class GreedyRegressor(Regressor):
    """Holds 4 GiB of the device per sample during its training step."""

    def training_step(self, batch, batch_idx):
        held = torch.empty(batch[0].shape[0] * 4 * GIB, dtype=torch.uint8, device=batch[0].device)
        output = super().training_step(batch, batch_idx)
        del held
        return output


@pytest.mark.gpu
def test_on_cuda_the_device_memory_bounds_the_choice_and_out_of_memory_is_a_miss(tmp_path, caplog):
    # Powers of two reach a size whose step cannot fit the GPU (out of memory, caught) or its budget.
    total = torch.cuda.get_device_properties(0).total_memory
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer = new_trainer(tmp_path, accelerator="cuda", batch_size=1, auto_batch_size=True, max_steps=1,
                              num_sanity_val_steps=0)
        trainer.fit(GreedyRegressor())
    chosen = trainer.batch_size
    assert 1 <= chosen and chosen * 4 * GIB <= 0.9 * total < (chosen + 1) * 4 * GIB + GIB
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("auto_batch_size:"))
    assert ", over)" in line
