"""The comms log: what collectives each rank issues over a window of steps."""

import json

import pytest

from helpers import BlockRegressor, fit
from trainer.comms_log import GRADIENT_KIND
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(240)


def reports(run_dir, ranks=2):
    return [json.loads((run_dir / "comms" / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("accumulate", [1, 4])
def test_ddp_syncs_gradients_once_per_optimizer_step(tmp_path, accumulate):
    # Window of 3 optimizer steps (2..4): one gradient all-reduce round each, whatever the
    # number of micro-batches (no_sync on all but the last).
    fit(tmp_path, BlockRegressor(), strategy="ddp", devices=2, batch_size=4, accumulate_grad_batches=accumulate,
        max_steps=5, log_every_n_steps=100, profile={"comms_steps": [2, 4]})
    for report in reports(tmp_path):
        assert report["steps"] == [2, 4]
        assert report["gradient_rounds"] == 3
        gradients = report["kinds"][GRADIENT_KIND]
        assert gradients["count"] % 3 == 0  # the same buckets in every round
        # Every parameter's gradient (fp32) is all-reduced once per round.
        assert gradients["bytes"] == 3 * 4 * sum(p.numel() for p in _model_params())
    summary = json.loads((tmp_path / "comms" / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["kinds"][GRADIENT_KIND]["count"] == 2 * reports(tmp_path)[0]["kinds"][GRADIENT_KIND]["count"]


def _model_params():
    module = BlockRegressor()
    module.configure_model()
    return list(module.parameters())


def test_fsdp_gathers_and_reduce_scatters(tmp_path):
    fit(tmp_path, BlockRegressor(depth=3), strategy=FSDPStrategy(), devices=2, batch_size=8, max_steps=3,
        log_every_n_steps=100, profile={"comms_steps": [2, 2]})
    for report in reports(tmp_path):
        kinds = report["kinds"]
        # 3 blocks + the root: gathered in forward (and again in backward for resharded units),
        # gradients reduce-scattered once per unit.
        assert kinds["reduce_scatter"]["count"] == 4
        assert kinds["all_gather"]["count"] >= 4
        assert report["gradient_rounds"] == 0 and GRADIENT_KIND not in kinds
