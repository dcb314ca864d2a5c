"""Draw the benchmark figures of the docs from the bench scripts' result files, and write their sections
of docs/benchmarks.md.

    python bench/plot_results.py           # docs/assets/bench/<name>.svg and the page's generated sections
    python bench/plot_results.py --check   # exit 1 when the page's sections are not what the result files give

Reads bench/results/<name>.json (bench/_results.py's format; bench/hot_path_overhead.py writes the same
top-level keys) for each bench in ``BENCHES``. A section of the page lies between
``<!-- bench:NAME begin -->`` and ``<!-- bench:NAME end -->`` and holds the figure, when and on what it was
measured, the figures as a table and the command that produced them; a bench without a result file
gets a line saying how to produce one. Drawing needs matplotlib (the ``docs`` extra); the sections
do not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
FIGURES = os.path.join(ROOT, "docs", "assets", "bench")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
FIGURE_LINK = "assets/bench"  # from docs/benchmarks.md
MIB = 2**20
#: above this 1-minute load average per core at the start, other work was running: timings are not
#: idle-machine ones. (Not lower: benches run one after another on an idle machine start with the
#: previous bench's own processes still in the 1-minute average, about 1 on 2 cores.)
BUSY_LOAD_PER_CORE = 0.75


# ----- the figures as tables (Markdown) ----------------------------------------------------------------------
def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def step_overhead_table(result: dict) -> list[str]:
    rows = [[name, "not installed", "", ""] if f is None else
            [name, f"{f['seconds']:.2f}", f"{f['steps_per_s']:.1f}", f"{f['ratio']:.3f}"]
            for name, f in result["results"].items()]
    return _table(["contender", f"seconds for {result['settings']['steps']} steps (best)", "steps/s",
                   "time vs hand-written loop"], rows)


def ddp_overhead_table(result: dict) -> list[str]:
    rows = []
    for label, round_ in result["results"].items():
        median = round_["median"]
        base = next(iter(median.values()))
        for name, m in median.items():
            rows.append([f"{round_['steps']} steps", name, f"{m['start-up']:.2f}", f"{m['steps']:.2f}", f"{m['end']:.2f}",
                         f"{m['total']:.2f}", f"{m['total'] / base['total']:.3f}", f"{m['steps cpu'] / base['steps cpu']:.3f}"])
    return _table(["run", "contender", "start-up s", "steps s", "end s", "total s", "total vs hand-written",
                   "steps CPU vs hand-written"], rows)


def hot_path_table(result: dict) -> list[str]:
    rows = []
    for r in result["results"]:
        for name, ratio in r["ratios"].items():
            wall, cpu = ratio["wall"], ratio["cpu"]
            rows.append([r["ranks"], name, f"{wall['median']:.3f} [{wall['min']:.3f}, {wall['max']:.3f}]",
                         f"{cpu['median']:.3f} [{cpu['min']:.3f}, {cpu['max']:.3f}]", len(wall["pairs"])])
    return _table(["ranks", "contender", f"wall vs {result['results'][0]['baseline']} (median [min, max])",
                   f"CPU vs {result['results'][0]['baseline']} (median [min, max])", "pairs"], rows)


def strategy_memory_table(result: dict) -> list[str]:
    rows = []
    for layout, r in result["results"].items():
        for rank, (m, e) in enumerate(zip(r["measured"], r["estimated"])):
            rows.append([layout, rank, *(f"{m[p] / MIB:.2f}" for p in ("parameters", "gradients", "optimizer", "total")),
                         f"{e['total'] / MIB:.2f}", f"{m['peak_rss'] / MIB:.0f}"])
    return _table(["layout", "rank", "parameters MiB", "gradients MiB", "optimizer MiB", "total MiB", "estimated MiB",
                   "process peak RSS MiB"], rows)


def _spread_cell(ratio: dict | None) -> str:
    return "unknown" if ratio is None else f"{ratio['median']:.3f} [{ratio['min']:.3f}, {ratio['max']:.3f}]"


def strategy_baselines_table(result: dict) -> list[str]:
    rows = []
    for strategy, r in result["results"].items():
        hand = sorted(run["wall_s"] for run in r["runs"][r["baseline"]])
        ratio = r["ratios"]["trainer"]
        rows.append([strategy, f"{hand[len(hand) // 2]:.2f}", _spread_cell(ratio["wall"]), _spread_cell(ratio["cpu"]),
                     len(ratio["wall"]["pairs"])])
    return _table(["strategy", "hand-written s (median)", "trainer / hand-written, wall (median [min, max])",
                   "CPU (median [min, max])", "pairs"], rows)


#: the rows strategy_baselines.py measures (its default --strategies), for the page before a measurement
STRATEGY_ROWS = ["ddp", "zero1", "fsdp_full", "fsdp_grad_op", "pipeline_gpipe", "pipeline_1f1b", "pipeline_interleaved",
                 "tp"]


def strategy_baselines_placeholder() -> list[str]:
    return _table(["strategy", "hand-written s (median)", "trainer / hand-written, wall (median [min, max])",
                   "CPU (median [min, max])", "pairs"], [[s, "not measured yet", "not measured yet", "", ""]
                                                         for s in STRATEGY_ROWS])


REPLAYS = ("replay_mean_calls", "replay_measured_calls", "replay_with_local_work", "replay_with_posting",
           "replay_with_hop")


def pipeline_bubble_table(result: dict) -> list[str]:
    rows = []
    for r in result["results"]:
        if "refused" in r:
            rows.append([r["schedule"], r["microbatches"], f"refused: {r['refused']}", f"{r['theory']:.3f}",
                         *[""] * (len(REPLAYS) + 1), r["formula"]])
            continue
        idle = [rank["idle"] for rank in r["ranks"]]
        # Older results have no trace replays (they came later): their cells stay empty.
        replays = [f"{r[key]:.3f}" if key in r else "" for key in REPLAYS]
        hop = f"{r['hop_ms']:.2f}" if "hop_ms" in r else ""
        rows.append([r["schedule"], r["microbatches"], f"{sum(idle) / len(idle):.3f}", f"{r['theory']:.3f}", *replays,
                     hop, r["formula"]])
    return _table(["schedule", "micro-batches", "idle fraction (mean of the ranks)", "theory",
                   "replayed: calls at their mean", "+ the calls' variation", "+ Python and loss between calls",
                   "+ posting the messages", "+ the message hop", "hop ms (median)", "formula"], rows)


def pipeline_bubble_placeholder() -> list[str]:
    return _table(["schedule", "micro-batches", "idle fraction (mean)", "theory"],
                  [[s, m, "not measured yet", f"{1 / (m + 1):.3f}"] for s in ("gpipe", "1f1b") for m in (2, 4, 8)] +
                  [["interleaved_1f1b", m, "not measured yet", f"{1 / (2 * m + 1):.3f}"] for m in (2, 4, 8)])


def gpu_check_table(result: dict) -> list[str]:
    sections = [[name, r["status"], f"{r.get('seconds', 0):.0f}", r.get("reason") or r.get("summary") or ""]
                for name, r in result["results"].items()]
    speed = []
    for row in result["results"].get("recipes", {}).get("rows", []):
        mfu = row.get("mfu")
        speed.append([row["recipe"], row["contender"], row["variant"], row["status"], f"{row.get('tokens_per_s', 0):.0f}",
                      f"{row.get('tflops_per_device', 0):.1f}", "" if mfu is None else f"{mfu:.3f}",
                      f"{row.get('peak_allocated_gb') or 0:.1f}"])
    memory = [[r["recipe"], f"{r['estimated_gib'] or 0:.2f}", f"{r['max_memory_allocated_gib'] or 0:.2f}",
               "" if r["ratio"] is None else f"{r['ratio']:.3f}"]
              for r in result["results"].get("estimate", {}).get("rows", [])]
    syncs = result["results"].get("host_syncs", {})
    return [*_table(["section", "status", "seconds", "note"], sections), "",
            *_table(["recipe", "contender", "variant", "status", "tokens/s", "TFLOP/s per device", "MFU", "peak GB"], speed),
            "", *_table(["recipe", "estimated GiB", "max_memory_allocated GiB", "estimated / measured"], memory), "",
            f"Host syncs per quiet step: {syncs.get('syncs_per_quiet_step')} (on a logging step: "
            f"{syncs.get('syncs_per_logging_step')})."]


def gpu_check_placeholder() -> list[str]:
    return _table(["recipe", "contender", "variant", "tokens/s", "MFU", "peak GB"],
                  [[recipe, contender, variant, "not measured yet", "", ""] for recipe in ("gpt", "llama")
                   for contender, variants in (("trainer", ("eager", "compile", "checkpointing")),
                                               ("hand-written", ("eager", "compile"))) for variant in variants])


# ----- the figures as plots (matplotlib) ----------------------------------------------------------------------
def _bars(ax, labels: list[str], values: list[float], errors=None, unit: str = "x") -> None:
    positions = list(range(len(labels)))
    ax.barh(positions, values, xerr=errors, color="#4c72b0", capsize=4)
    ax.set_yticks(positions, labels)
    ax.invert_yaxis()
    for y, value in zip(positions, values):
        ax.annotate(f" {value:.3f}{unit}", (value, y), va="center", fontsize=8)


def draw_step_overhead(result: dict, plt):
    measured = {name: f for name, f in result["results"].items() if f is not None}
    fig, ax = plt.subplots(figsize=(7, 2.4))
    _bars(ax, list(measured), [f["ratio"] for f in measured.values()])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"time for {result['settings']['steps']} steps / the hand-written loop's (1 process, best of "
                  f"{result['settings']['repeats']})")
    return fig


def draw_ddp_overhead(result: dict, plt):
    rounds = list(result["results"].values())
    fig, axes = plt.subplots(1, len(rounds), figsize=(7, 2.6), squeeze=False)
    for ax, round_ in zip(axes[0], rounds):
        median = round_["median"]
        base = next(iter(median.values()))
        _bars(ax, list(median), [m["total"] / base["total"] for m in median.values()])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{round_['steps']} steps, 2 ranks (median of {round_['pairs']})", fontsize=9)
        ax.set_xlabel("whole run / hand-written mp.spawn")
    fig.tight_layout()
    return fig


def draw_hot_path(result: dict, plt):
    runs = result["results"]
    fig, axes = plt.subplots(1, len(runs), figsize=(7, 2.4), squeeze=False)
    for ax, r in zip(axes[0], runs):
        names = list(r["ratios"])
        walls = [r["ratios"][n]["wall"] for n in names]
        medians = [w["median"] for w in walls]
        errors = [[m - w["min"] for m, w in zip(medians, walls)], [w["max"] - m for m, w in zip(medians, walls)]]
        _bars(ax, names, medians, errors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{r['ranks']} rank(s), {len(walls[0]['pairs'])} pairs", fontsize=9)
        ax.set_xlabel(f"whole process / {r['baseline']} (median, min-max)")
    fig.tight_layout()
    return fig


def draw_strategy_memory(result: dict, plt):
    labels, parts, estimated = [], {p: [] for p in ("parameters", "gradients", "optimizer")}, []
    for layout, r in result["results"].items():
        for rank, (m, e) in enumerate(zip(r["measured"], r["estimated"])):
            name = layout.replace(" ", "\n")
            labels.append(f"{name}\nrank {rank}" if r["world"] > 1 else name)
            for part in parts:
                parts[part].append(m[part] / MIB)
            estimated.append(e["total"] / MIB)
    fig, ax = plt.subplots(figsize=(9, 3.4))
    bottom = [0.0] * len(labels)
    for (part, values), color in zip(parts.items(), ("#4c72b0", "#dd8452", "#55a868")):
        ax.bar(range(len(labels)), values, bottom=bottom, label=f"{part} (measured)", color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.scatter(range(len(labels)), estimated, marker="D", color="black", zorder=3, label="estimated total")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("MiB per rank")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"{result['settings']['model']}, {result['settings']['optimizer']}: training state per rank", fontsize=9)
    fig.tight_layout()
    return fig


def _ratio_bars(ax, labels: list[str], ratios: list[dict], xlabel: str) -> None:
    medians = [r["median"] for r in ratios]
    errors = [[m - r["min"] for m, r in zip(medians, ratios)], [r["max"] - m for m, r in zip(medians, ratios)]]
    _bars(ax, labels, medians, errors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(xlabel)


def draw_strategy_baselines(result: dict, plt):
    names = list(result["results"])
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.2))
    _ratio_bars(ax, names, [result["results"][n]["ratios"]["trainer"]["wall"] for n in names],
                f"trainer / hand-written torch loop, whole process ({result['settings']['world']} CPU ranks; median, min-max)")
    return fig


def draw_pipeline_bubble(result: dict, plt):
    rows = [r for r in result["results"] if "ranks" in r]
    labels = [f"{r['schedule']} m={r['microbatches']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    positions = list(range(len(rows)))
    ax.barh(positions, [sum(k["idle"] for k in r["ranks"]) / len(r["ranks"]) for r in rows], color="#4c72b0",
            label="measured (mean of the ranks)")
    ax.scatter([r["theory"] for r in rows], positions, marker="D", color="black", zorder=3, label="theory")
    replayed = [(p, r["replay_with_hop"]) for p, r in zip(positions, rows) if "replay_with_hop" in r]
    if replayed:
        ax.scatter([x for _, x in replayed], [p for p, _ in replayed], marker="|", s=120, color="#dd8452", zorder=4,
                   label="replayed with the measured hop")
    ax.set_yticks(positions, labels)
    ax.invert_yaxis()
    ax.set_xlabel("idle fraction of the pipeline's step")
    ax.legend(fontsize=7)
    return fig


def draw_gpu_check(result: dict, plt):
    rows = [r for r in result["results"].get("recipes", {}).get("rows", []) if r.get("tokens_per_s")]
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(rows), 1) + 1.2))
    _bars(ax, [f"{r['recipe']} {r['contender']} {r['variant']}" for r in rows], [r["tokens_per_s"] for r in rows],
          unit=" tok/s")
    ax.set_xlabel("tokens/s (one device, bf16-mixed)")
    return fig


@dataclass(frozen=True)
class Bench:
    name: str  # its result file: bench/results/<name>.json
    script: str  # what produces it, on an idle machine
    timing: bool  # figures in seconds (a busy machine changes them) or in bytes (it does not)
    table: Callable[[dict], list[str]]
    draw: Callable
    placeholder: Callable[[], list[str]] | None = None  # the table's rows before a measurement


BENCHES = [
    Bench("hot_path_overhead", "python bench/hot_path_overhead.py", True, hot_path_table, draw_hot_path),
    Bench("step_overhead", "python bench/step_overhead.py", True, step_overhead_table, draw_step_overhead),
    Bench("ddp_overhead", "python bench/ddp_overhead.py", True, ddp_overhead_table, draw_ddp_overhead),
    Bench("strategy_memory", "python bench/strategy_memory.py", False, strategy_memory_table, draw_strategy_memory),
    Bench("strategy_baselines", "python bench/strategy_baselines.py", True, strategy_baselines_table,
          draw_strategy_baselines, strategy_baselines_placeholder),
    Bench("pipeline_bubble", "python bench/pipeline_bubble.py", True, pipeline_bubble_table, draw_pipeline_bubble,
          pipeline_bubble_placeholder),
    Bench("gpu_check", "bash bench/gpu_check.sh", True, gpu_check_table, draw_gpu_check, gpu_check_placeholder),
]


def load(name: str, results: str = RESULTS) -> dict | None:
    path = os.path.join(results, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _busy(result: dict, timing: bool) -> bool:
    return timing and result["load_average"]["start"] > BUSY_LOAD_PER_CORE * (result["machine"].get("cpu_count") or 1)


def _stamp(result: dict, timing: bool) -> str:
    """The figure's own line: when, on what, and whether the machine was busy (a figure travels alone)."""
    m = result["machine"]
    line = f"{result['date'][:10]}, {m['processor']}, {m['cpu_count']} cores{', ' + m['gpu'] if m.get('gpu') else ''}"
    if _busy(result, timing):
        line += f"; BUSY machine (load average {result['load_average']['start']:.1f}): not idle-machine timings"
    return line


def _when(result: dict, timing: bool, script: str) -> list[str]:
    m, load_average = result["machine"], result["load_average"]
    date = result["date"].replace("T", " ").replace("Z", " UTC")
    lines = [f"Measured {date} on {m['processor']} ({m['cpu_count']} cores"
             f"{', ' + m['gpu'] if m.get('gpu') else ', no GPU'}), python {m['python']}, torch {m['torch']}"
             f"{', lightning ' + m['lightning'] if m.get('lightning') else ''}; load average "
             f"{load_average['start']:.2f} at the start, {load_average['end']:.2f} at the end."]
    if _busy(result, timing):
        lines += ["", '!!! warning "Measured on a busy machine"',
                  f"    Other work was running (load average {load_average['start']:.2f} at the start, on "
                  f"{m['cpu_count']} cores): these timings show how the run behaves under load, not idle-machine "
                  f"figures. Run `{script}` on an idle machine for those."]
    elif not timing:
        lines += ["", "These are byte counts of the tensors each rank holds: other work on the machine does not "
                  "change them."]
    return lines


def section(bench: Bench, result: dict | None) -> list[str]:
    """The page's lines between the bench's markers."""
    if result is None:
        where = "a machine with a CUDA device" if bench.name == "gpu_check" else "an idle machine"
        return [f"Not measured yet: run `{bench.script}` on {where}, then `python bench/plot_results.py`.",
                *(["", *bench.placeholder()] if bench.placeholder else [])]
    return [f"![{bench.name}]({FIGURE_LINK}/{bench.name}.svg)", "", *_when(result, bench.timing, bench.script), "",
            *bench.table(result), "", f"Produced by `{result['command']}`, drawn by `python bench/plot_results.py`."]


def render_page(page: str, results: str = RESULTS) -> str:
    """``page`` with every bench's section replaced by what its result file gives."""
    for bench in BENCHES:
        begin, end = f"<!-- bench:{bench.name} begin -->", f"<!-- bench:{bench.name} end -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise ValueError(f"{os.path.relpath(PAGE, ROOT)} has no {begin} ... {end} section")
        body = "\n".join([begin, *section(bench, load(bench.name, results)), end])
        page = pattern.sub(lambda _: body, page)
    return page


def draw_all(results: str = RESULTS, figures: str = FIGURES) -> list[str]:
    """Draw the figure of every bench that has a result file; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The same result file gives the same SVG bytes: no date, fixed ids, text kept as text.
    plt.rcParams.update({"svg.hashsalt": "bench", "svg.fonttype": "none", "font.size": 8})
    os.makedirs(figures, exist_ok=True)
    written = []
    for bench in BENCHES:
        result = load(bench.name, results)
        if result is None:
            continue
        fig = bench.draw(result, plt)
        fig.suptitle(_stamp(result, bench.timing), fontsize=7, color="#b00000" if _busy(result, bench.timing) else "black")
        fig.tight_layout(rect=(0, 0, 1, 0.93))  # room for that line above the axes' titles
        path = os.path.join(figures, f"{bench.name}.svg")
        fig.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is not what the result files give")
    args = parser.parse_args(argv)
    with open(PAGE) as f:
        page = f.read()
    rendered = render_page(page)
    if args.check:
        missing = [b.name for b in BENCHES if load(b.name) is not None
                   and not os.path.exists(os.path.join(FIGURES, f"{b.name}.svg"))]
        if rendered != page or missing:
            print(f"docs/benchmarks.md or its figures {missing or ''} are stale: run python bench/plot_results.py",
                  file=sys.stderr)
            return 1
        return 0
    for path in draw_all():
        print(f"drew {os.path.relpath(path, ROOT)}")
    with open(PAGE, "w") as f:
        f.write(rendered)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
