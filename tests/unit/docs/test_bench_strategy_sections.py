"""bench/plot_results.py's sections for bench/strategy_baselines.py, bench/pipeline_bubble.py and
bench/gpu_check.sh: a "not measured yet" table before any result file, then the figures of a result
in each script's format (figures made up for the test), as tables and as figures."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_results", os.path.join(ROOT, "bench", "plot_results.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


plots = _plot_module()
BENCH = {b.name: b for b in plots.BENCHES}
MACHINE = {"platform": "Linux", "processor": "Test CPU", "cpu_count": 16, "gpu": None, "python": "3.11.7",
           "torch": "2.13.0", "lightning": None}


def _result(name: str, settings: dict, results) -> dict:
    return {"benchmark": name, "date": "2026-01-02T03:04:05Z", "command": f"python bench/{name}.py", "machine": MACHINE,
            "load_average": {"start": 0.1, "end": 0.5}, "settings": settings, "results": results}


def _ratio(median: float) -> dict:
    return {"pairs": [median - 0.01, median, median + 0.02], "median": median, "min": median - 0.01, "max": median + 0.02}


STRATEGIES = _result("strategy_baselines", {"world": 2}, {
    name: {"baseline": "hand-written",
           "runs": {"hand-written": [{"wall_s": 10.0 + i} for i in range(3)], "trainer": [{"wall_s": 10.0}] * 3},
           "ratios": {"trainer": {"wall": _ratio(r), "cpu": None if name == "tp" else _ratio(r - 0.05)}}}
    for name, r in (("ddp", 0.987), ("fsdp_full", 1.042), ("tp", 1.013))})
BUBBLE = _result("pipeline_bubble", {"steps": 10}, [
    {"schedule": "1f1b", "microbatches": 4, "theory": 0.2, "formula": "(p-1)/(m+p-1)",
     "ranks": [{"idle": 0.21, "on_cpu": 0.99, "step_ms": 12.0}, {"idle": 0.23, "on_cpu": 0.98, "step_ms": 12.0}]},
    {"schedule": "1f1b", "microbatches": 8, "theory": 0.111, "formula": "(p-1)/(m+p-1)",
     "replay_mean_calls": 0.14, "replay_measured_calls": 0.16, "replay_with_local_work": 0.17,
     "replay_with_posting": 0.19, "replay_with_hop": 0.195, "hop_ms": 0.81, "call_ms": 1.52, "hops": 70,
     "posting_ms_per_step": 20.5,
     "ranks": [{"idle": 0.18, "p2p": 0.17, "other": 0.01, "on_cpu": 0.99, "step_ms": 12.0},
               {"idle": 0.22, "p2p": 0.2, "other": 0.02, "on_cpu": 0.98, "step_ms": 12.0}]},
    {"schedule": "looped_bfs", "microbatches": 2, "theory": 0.2, "formula": "(p-1)/(v*m+p-1), v=2",
     "refused": "needs more micro-batches"}])
GPU = _result("gpu_check", {"mode": "cuda"}, {
    "gpu_tests": {"status": "ok", "seconds": 61.0, "summary": "9 passed in 60.1s"},
    "recipes": {"status": "ok", "seconds": 200.0, "rows": [
        {"recipe": "gpt", "contender": "trainer", "variant": "eager", "status": "ok", "tokens_per_s": 51234.0,
         "tflops_per_device": 401.5, "mfu": 0.406, "peak_allocated_gb": 41.2},
        {"recipe": "gpt", "contender": "hand-written", "variant": "compile", "status": "skipped", "reason": "budget"}]},
    "estimate": {"status": "ok", "seconds": 20.0, "rows": [
        {"recipe": "gpt", "estimated_gib": 40.0, "max_memory_allocated_gib": 38.0, "ratio": 40 / 38}]},
    "host_syncs": {"status": "ok", "seconds": 30.0, "syncs_per_quiet_step": 0, "syncs_per_logging_step": 3}})


@pytest.mark.parametrize("name", ["strategy_baselines", "pipeline_bubble", "gpu_check"])
def test_before_a_measurement_the_section_says_not_measured_yet_with_a_table(name):
    lines = plots.section(BENCH[name], None)
    assert lines[0].startswith("Not measured yet: run `")
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) > 3 and all("not measured yet" in line for line in table[2:])


def test_the_tables_give_each_results_figures():
    strategies = "\n".join(plots.strategy_baselines_table(STRATEGIES))
    assert "| ddp | 11.00 | 0.987 [0.977, 1.007] | 0.937 [0.927, 0.957] | 3 |" in strategies
    assert "| tp | 11.00 | 1.013 [1.003, 1.033] | unknown | 3 |" in strategies
    bubble = "\n".join(plots.pipeline_bubble_table(BUBBLE))
    assert "| 1f1b | 4 | 0.220 | 0.200 |  |  |  |  |  |  | (p-1)/(m+p-1) |" in bubble  # no replays
    assert "| 1f1b | 8 | 0.200 | 0.111 | 0.140 | 0.160 | 0.170 | 0.190 | 0.195 | 0.81 | (p-1)/(m+p-1) |" in bubble
    assert "refused: needs more micro-batches" in bubble
    gpu = "\n".join(plots.gpu_check_table(GPU))
    assert "| gpt | trainer | eager | ok | 51234 | 401.5 | 0.406 | 41.2 |" in gpu
    assert "| gpt | 40.00 | 38.00 | 1.053 |" in gpu
    assert "Host syncs per quiet step: 0 (on a logging step: 3)." in gpu


def test_the_figures_draw(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for result in (STRATEGIES, BUBBLE, GPU):
        fig = BENCH[result["benchmark"]].draw(result, plt)
        fig.savefig(tmp_path / f"{result['benchmark']}.svg", format="svg")
        plt.close(fig)
        assert (tmp_path / f"{result['benchmark']}.svg").stat().st_size > 1000
