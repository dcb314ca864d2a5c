"""bench/plot_results.py: docs/benchmarks.md's sections are what the checked-in result files give; the
figures draw from every checked-in result file, and from a result in bench/hot_path_overhead.py's format."""

import copy
import importlib.util
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_results", os.path.join(ROOT, "bench", "plot_results.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


plots = _plot_module()
CHECKED_IN = sorted(f[:-5] for f in os.listdir(plots.RESULTS) if f.endswith(".json"))

#: bench/hot_path_overhead.py's result, in the format its write_result documents (figures made up for the test)
HOT = {
    "benchmark": "hot_path_overhead", "date": "2026-01-02T03:04:05Z", "command": "python bench/hot_path_overhead.py",
    "machine": {"platform": "Linux", "processor": "Test CPU", "cpu_count": 16, "python": "3.11.7", "torch": "2.13.0",
                "lightning": "2.6.6"},
    "load_average": {"start": 0.05, "end": 1.9},
    "settings": {"steps": 1500, "pairs": 3, "warmup": 1},
    "results": [{"ranks": ranks, "baseline": "hand-written",
                 "runs": {name: [{"wall_s": 10.0, "cpu_s": 9.0, "peak_rss_mb": 300.0}] * 3
                          for name in ("hand-written", "trainer", "lightning")},
                 "ratios": {name: {kind: {"pairs": [r - 0.01, r, r + 0.02], "median": r, "min": r - 0.01, "max": r + 0.02}
                                   for kind in ("wall", "cpu")}
                            for name, r in (("trainer", 1.021 * ranks), ("lightning", 1.25))}}
                for ranks in (1, 2)],
}


def test_the_checked_in_result_files_are_there():
    assert {"strategy_memory", "step_overhead", "ddp_overhead"} <= set(CHECKED_IN)
    assert set(CHECKED_IN) <= {b.name for b in plots.BENCHES}


def test_the_page_sections_are_what_the_result_files_give():
    with open(plots.PAGE) as f:
        page = f.read()
    assert plots.render_page(page) == page, "stale: run python bench/plot_results.py"
    assert plots.main(["--check"]) == 0
    for name in CHECKED_IN:
        result = plots.load(name)
        assert f"![{name}](assets/bench/{name}.svg)" in page
        assert f"Produced by `{result['command']}`" in page
        assert os.path.exists(os.path.join(plots.FIGURES, f"{name}.svg"))


def test_the_memory_table_gives_every_rank_of_every_layout_with_the_estimate():
    result = plots.load("strategy_memory")
    lines = plots.strategy_memory_table(result)
    assert len(lines) == 2 + sum(r["world"] for r in result["results"].values())
    ddp = result["results"]["ddp"]["measured"][0]
    assert f"| ddp | 0 | {ddp['parameters'] / 2**20:.2f} |" in "\n".join(lines)


def test_a_busy_machine_is_said_for_timings_only():
    timing = next(b for b in plots.BENCHES if b.timing)
    memory = next(b for b in plots.BENCHES if not b.timing)
    busy = copy.deepcopy(HOT)
    busy["load_average"]["start"] = 0.9 * HOT["machine"]["cpu_count"]  # per core: above the bench's own trail
    assert any("busy machine" in line for line in plots.section(timing, busy))
    busy["load_average"]["start"] = 0.5 * HOT["machine"]["cpu_count"]
    assert not any("busy machine" in line for line in plots.section(timing, busy))
    assert not any("busy machine" in line for line in plots.section(timing, HOT))  # the start load: before the bench
    busy_memory = copy.deepcopy(plots.load("strategy_memory"))
    busy_memory["load_average"]["start"] = 7.5
    assert not any("busy machine" in line for line in plots.section(memory, busy_memory))
    assert any("does not change them" in line for line in plots.section(memory, busy_memory))
    assert plots.section(timing, None) == [
        f"Not measured yet: run `{timing.script}` on an idle machine, then `python bench/plot_results.py`."]


def test_the_hot_path_result_gives_its_ratios_with_their_spread():
    lines = plots.hot_path_table(HOT)
    assert "| 2 | trainer | 2.042 [2.032, 2.062] | 2.042 [2.032, 2.062] | 3 |" in lines
    assert "| 1 | lightning | 1.250 [1.240, 1.270] | 1.250 [1.240, 1.270] | 3 |" in lines


def test_figures_draw_from_every_result_file(tmp_path):
    pytest.importorskip("matplotlib", reason="drawing needs the docs extra (pip install -e '.[docs]')")
    results = tmp_path / "results"
    results.mkdir()
    for name in CHECKED_IN:
        (results / f"{name}.json").write_text(json.dumps(plots.load(name)))
    (results / "hot_path_overhead.json").write_text(json.dumps(HOT))
    written = plots.draw_all(str(results), str(tmp_path / "figures"))
    assert sorted(os.path.basename(p) for p in written) == sorted(f"{n}.svg" for n in {*CHECKED_IN, "hot_path_overhead"})
    for path in written:
        texts = " ".join(t.text or "" for t in ElementTree.parse(path).iter() if t.tag.endswith("text"))
        assert texts.strip(), path
        if path.endswith("hot_path_overhead.svg"):
            assert "trainer" in texts and "lightning" in texts and "2 rank(s), 3 pairs" in texts
        if path.endswith("strategy_memory.svg"):
            assert "estimated total" in texts and "MiB per rank" in texts
    again = plots.draw_all(str(results), str(tmp_path / "again"))
    for first, second in zip(written, again):  # the same file gives the same bytes (no date, fixed ids)
        with open(first, "rb") as a, open(second, "rb") as b:
            assert a.read() == b.read()


def test_a_bench_result_file_says_when_where_and_how_it_was_measured(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        from _results import Recorder
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "bench", "step_overhead.py"), "--steps", "20"])
    recorder = Recorder("step_overhead", {"steps": 20}, str(tmp_path / "out.json"))
    recorder.write({"hand-written loop": {"seconds": 2.0, "steps_per_s": 10.0, "ratio": 1.0}})
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["benchmark"] == "step_overhead" and result["settings"] == {"steps": 20}
    assert result["command"] == "python bench/step_overhead.py --steps 20"
    assert result["date"].endswith("Z") and set(result["load_average"]) == {"start", "end"}
    assert {"processor", "cpu_count", "torch", "python", "lightning", "gpu"} <= set(result["machine"])
    assert plots.step_overhead_table(result)[2] == "| hand-written loop | 2.00 | 10.0 | 1.000 |"
