"""The comms log: what collectives each rank issues over a window of steps."""

import json

import pytest

from tests.support.helpers import BlockRegressor, fit
from trainer.runtime.comms_log import GRADIENT_KIND
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


STRATEGIES = {  # name: (strategy, its options, devices)
    "single": ("single", {}, 1),
    "ddp": ("ddp", {}, 2),
    "ddp_zero1": ("ddp", {"zero1": True}, 2),
    "fsdp": ("fsdp", {}, 2),
    "pipeline": ("pipeline", {"microbatches": 2}, 2),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_comms_log_under_every_strategy(tmp_path, name):
    # Recorded by a dispatch mode over c10d's operators: nothing in torch is replaced, so the
    # pipeline schedules' P2POp batches work (replacing isend/irecv broke P2POp's check).
    from trainer.strategies import resolve_strategy

    strategy, options, ranks = STRATEGIES[name]
    fit(tmp_path, BlockRegressor(depth=2), strategy=resolve_strategy(strategy, **options), devices=ranks, batch_size=4,
        max_steps=4, log_every_n_steps=100, profile={"comms_steps": [3, 3]})  # (DDP rebuilds buckets at step 2)
    kinds = [report["kinds"] for report in reports(tmp_path, ranks)]
    expected = {
        "single": set(),  # one process: no process group, no collective
        "ddp": {GRADIENT_KIND},
        "ddp_zero1": {GRADIENT_KIND, "broadcast"},  # ZeRO-1 broadcasts each rank's updated shard
        "fsdp": {"all_gather", "reduce_scatter"},
        "pipeline": {"send_recv"},  # activations forward, gradients back
    }[name]
    for rank_kinds in kinds:
        assert expected <= set(rank_kinds), rank_kinds
    if name == "ddp":  # one step, one gradient round, nothing else (not a logging step)
        assert [sorted(k) for k in kinds] == [[GRADIENT_KIND]] * 2
        assert [r["gradient_rounds"] for r in reports(tmp_path, ranks)] == [1, 1]
    assert json.loads((tmp_path / "comms" / "summary.json").read_text())["ranks"] == ranks
