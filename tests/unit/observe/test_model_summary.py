"""The model summary at the start of fit: counts of a known model, one process and split over 2 ranks."""

import logging
import os
import re

import pytest
import torch

from tests.support.helpers import BlockRegressor, run_trainer
from trainer import Trainer
from trainer.observe.model_summary import summarize
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)

# BlockRegressor(width=8, depth=2): inp Linear(6, 8) = 56; each block LayerNorm(8) 16 + Linear(8, 8) 72
# = 88; out Linear(8, 1) = 9. Total 241 parameters, fp32: 964 bytes.
ROWS = [("inp", "Linear", 56), ("blocks", "ModuleList", 176), ("out", "Linear", 9)]


class FrozenInput(BlockRegressor):
    def configure_model(self):
        super().configure_model()
        self.inp.requires_grad_(False)


def _summary_lines(run_dir):
    text = open(os.path.join(str(run_dir), "train.log")).read()
    return text[text.index("model summary:"):].splitlines()


def test_counts_of_a_known_model():
    module = FrozenInput(width=8, depth=2)
    module.configure_model()
    summary = summarize(module)
    assert [row[:3] for row in summary.rows] == ROWS
    assert (summary.trainable, summary.frozen, summary.total, summary.size_bytes) == (185, 56, 241, 964)
    module.to(torch.bfloat16)
    assert summarize(module).size_bytes == 482  # by each parameter's element size
    table = summary.table()
    assert re.search(r"0 \| inp\s+\| Linear\s+\| 56", table) and "241      Total params" in table
    assert "Rank 0 holds" not in table  # one process holds everything


def test_fit_logs_the_table_and_enable_model_summary_false_turns_it_off(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainer")  # in-process: pytest's handler, no train.log
    run_trainer(tmp_path / "on", FrozenInput(width=8, depth=2), max_steps=1)
    lines = caplog.text[caplog.text.index("model summary:"):].splitlines()
    assert any(re.match(r"1 \| blocks\s+\| ModuleList \| 176", line) for line in lines)
    assert any(line.startswith("56       Non-trainable params") for line in lines)
    run_trainer(tmp_path / "off", FrozenInput(width=8, depth=2), max_steps=1, enable_model_summary=False)
    assert caplog.text.count("model summary") == 1
    with pytest.raises(ValueError, match="enable_model_summary must be true or false, got 'yes'"):
        Trainer(enable_model_summary="yes")


@pytest.mark.parametrize("layout", ["fsdp", "pipeline"])
def test_per_rank_share_when_the_model_is_split(tmp_path, layout):
    strategy = FSDPStrategy() if layout == "fsdp" else PipelineStrategy(microbatches=2)
    run_trainer(tmp_path, BlockRegressor(width=8, depth=2), strategy=strategy, devices=2, batch_size=8, max_steps=1)
    lines = _summary_lines(tmp_path)
    assert any(line.startswith("241      Total params") for line in lines)  # the whole model's count
    shares = re.search(r"Params held per rank: rank 0: (\d+), rank 1: (\d+)", "\n".join(lines))
    assert shares, lines
    rank0, rank1 = int(shares.group(1)), int(shares.group(2))
    assert rank0 + rank1 == 241
    if layout == "fsdp":
        # fully_shard splits dim 0: inp 4x6+4, each block 4+4+4x8+4, out's (1, 8) weight and (1,) bias on rank 0.
        assert (rank0, rank1) == (125, 116)
        assert any(re.match(r"2 \| out\s+\| Linear\s+\| 9\s+\| 9", line) for line in lines)
    else:
        assert rank0 > 0 and rank1 > 0
