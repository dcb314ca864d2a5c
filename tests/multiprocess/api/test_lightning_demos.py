"""Lightning's own demo modules (``lightning/pytorch/demos/`` as installed: BoringModel, BoringDataModule,
ManualOptimBoringModel, DemoModel, LightningLSTM, MNISTDataModule, LightningTransformer), read from the
installed package with only their import lines rewritten to ``trainer.lightning``
(tests/support/lightning_demos/), run fit / validate / test / predict where they define the hooks, on one
process, DDP 2 and FSDP 2, with tiny local files in place of their downloads.

``boring_uneven_sizes`` is BoringModel subclassed as its docstring says, with data sizes that divide
neither the batch nor the ranks. Each 2-rank strategy runs every demo in one pair of processes (tests/support/lightning_demo_runs.py).
What is compared: one process (accumulating the 2 ranks' per-rank batches into the same global batch)
and each 2-rank strategy give the same trained weights, validation / test metrics and predictions
(rtol 1e-5). ManualOptimBoringModel cannot accumulate on one process (manual optimization steps once
per batch), so for it DDP 2 and FSDP 2 are compared with each other, and one process checks it trains.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.lightning_demos import lightning_root

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(lightning_root() is None, reason="the lightning package (a dev dependency) is not installed: "
                       "its demo modules are what this test runs"),
]

STRATEGIES = ("single", "ddp", "fsdp")
TOL = dict(rtol=1e-5, atol=1e-6)

#: demo -> the calls it makes (the hooks it defines data and steps for)
CALLS = {
    "boring": ("fit", "validate", "test", "predict"),
    "boring_uneven_sizes": ("fit", "validate", "test", "predict"),
    "boring_datamodule": ("fit", "validate", "test", "predict"),
    "manual_optimization": ("fit", "validate", "test", "predict"),
    "demo_model": ("fit", "predict"),
    "lstm": ("fit",),
    "mnist": ("fit", "validate", "test"),
    "transformer": ("fit",),
}

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every demo on every strategy: ``{strategy: {demo: {call: result}}}``."""
    from tests.support.lightning_demo_runs import run_all, run_ranks, write_fake_downloads

    root = str(tmp_path_factory.mktemp("lightning_demos"))
    write_fake_downloads(root)
    previous, mocked = os.getcwd(), os.environ.get("PL_USE_MOCKED_MNIST")
    os.environ["PL_USE_MOCKED_MNIST"] = "1"  # the MNIST demo reads its own file format, not torchvision's download
    os.chdir(root)  # WikiText2 reads ./data/wikitext-2.txt
    try:
        return {"single": run_all("single", root), "ddp": run_ranks("ddp", root), "fsdp": run_ranks("fsdp", root)}
    finally:
        os.chdir(previous)
        if mocked is None:
            os.environ.pop("PL_USE_MOCKED_MNIST")
        else:
            os.environ["PL_USE_MOCKED_MNIST"] = mocked


def _cases():
    return [pytest.param(demo, strategy, id=f"{demo}-{strategy}") for demo in CALLS for strategy in STRATEGIES]


def _assert_same(result, reference, what):
    if isinstance(reference, dict):
        assert sorted(result) == sorted(reference), what
        for key in reference:
            _assert_same(result[key], reference[key], f"{what}[{key!r}]")
    elif isinstance(reference, torch.Tensor):
        torch.testing.assert_close(result, reference, **TOL, msg=lambda m: f"{what}: {m}")
    elif isinstance(reference, (list, tuple)) and reference and not isinstance(reference[0], (int, float)):
        assert len(result) == len(reference), what  # (Lightning's list of one metrics dict per loader)
        for index, (got, expected) in enumerate(zip(result, reference)):
            _assert_same(got, expected, f"{what}[{index}]")
    else:
        assert result == pytest.approx(reference, rel=TOL["rtol"], abs=TOL["atol"]), what


@pytest.mark.parametrize("demo,strategy", _cases())
def test_demo_runs_and_trains_as_one_process(runs, demo, strategy):
    result = runs[strategy][demo]
    assert "error" not in result, f"{demo} on {strategy}: {result.get('error')}\n{result.get('traceback', '')}"
    assert [call for call in CALLS[demo] if call not in result] == []
    trained = result["params"]
    reference = runs["ddp"][demo] if demo == "manual_optimization" else runs["single"][demo]
    if demo == "manual_optimization" and strategy == "single":
        reference = result  # (its reference is DDP 2: see the module docstring)
    moved = [name for name, value in trained.items() if not torch.equal(value, result["initial"][name])]
    assert moved, f"{demo} on {strategy}: no weight changed in fit"
    if result is reference:
        return
    for call in ("params", "validate", "test", "predict"):
        if call in CALLS[demo] or call == "params":
            _assert_same(result[call], reference[call], f"{demo} {call} on {strategy}")
