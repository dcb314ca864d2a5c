"""The machinery of bench/lightning_examples.py: port a program (its imports rewritten, nothing else),
run it under Lightning or under ``trainer.lightning`` through bench/_lightning_example_runner.py, and
turn the per-batch losses it recorded into per-optimizer-step losses to compare.

- ``port(source_dir, dest_dir)``: every ``.py`` file under ``source_dir`` copied with its import lines
  rewritten (tests/support/lightning_rewrite.py); Lightning's demo modules a program imports
  (``lightning.pytorch.demos``) are served from ``dest_dir/lightning_demos_ported/``, the installed
  demos ported the same way.
- ``run(mode, program, args, out_dir, ...)``: one run in a fresh process; its records and exit.
- ``step_losses(out_dir, accumulate)``: one sample-weighted loss per optimizer step: the ranks' batches
  of one step (2 ranks) or the ``accumulate`` micro-batches of one step (one process).
- ``compare(got, reference, rtol)``: the largest relative difference, and whether it is within ``rtol``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.support.lightning_rewrite import rewrite_imports  # noqa: E402

DEMOS_PACKAGE = "lightning_demos_ported"
_DEMOS_PATH = re.compile(r"(?<![\w.])(lightning\.pytorch|pytorch_lightning)\.demos(?![\w])")
_IMPORT_LINE = re.compile(r"^\s*(from|import)\s")


def ported_source(source: str) -> str:
    """``source`` with Lightning's module names in its import statements replaced: the demos by
    :data:`DEMOS_PACKAGE`, everything else by ``trainer.lightning``."""
    lines = source.splitlines(keepends=True)
    lines = [_DEMOS_PATH.sub(DEMOS_PACKAGE, line) if _IMPORT_LINE.match(line) else line for line in lines]
    return rewrite_imports("".join(lines))


def _copy_tree(source_dir: str, dest_dir: str, transform) -> None:
    for folder, _, files in os.walk(source_dir):
        target = os.path.join(dest_dir, os.path.relpath(folder, source_dir))
        os.makedirs(target, exist_ok=True)
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and transform is not None:
                with open(path, encoding="utf-8") as f:
                    text = transform(f.read())
                with open(os.path.join(target, name), "w", encoding="utf-8") as f:
                    f.write(text)
            else:
                shutil.copy2(path, os.path.join(target, name))


def port(source_dir: str, dest_dir: str) -> None:
    """``source_dir``'s programs, imports rewritten, into ``dest_dir`` (see the module docstring)."""
    _copy_tree(source_dir, dest_dir, ported_source)
    import importlib.util

    spec = importlib.util.find_spec("lightning")
    if spec is not None and spec.submodule_search_locations:
        demos = os.path.join(list(spec.submodule_search_locations)[0], "pytorch", "demos")
        _copy_tree(demos, os.path.join(dest_dir, DEMOS_PACKAGE), ported_source)


def copy_unchanged(source_dir: str, dest_dir: str) -> None:
    """``source_dir`` as it is (Lightning's runs read their programs from a copy laid out as the port)."""
    _copy_tree(source_dir, dest_dir, None)


@dataclass
class Run:
    """One program run: its exit status, the end of its output, and each rank's loss records."""

    returncode: int
    output_tail: str
    records: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        """None for a run that exited 0 and recorded losses; else its last meaningful output line."""
        if self.returncode == 0 and self.records:
            return None
        if self.returncode == 0:
            return "no training batch recorded"
        lines = [line for line in self.output_tail.splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Exit)\b", line.strip())]
        return (errors or lines or [f"exit {self.returncode}"])[-1].strip()[:300]


def run(mode: str, program: str, args: list[str], out_dir: str, cwd: str, defaults: dict | None = None,
        env: dict | None = None, pythonpath: list[str] = (), timeout: float = 600) -> Run:
    """``program args`` under ``mode`` ("lightning" / "mirror") in a fresh process, in ``cwd``."""
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(cwd, exist_ok=True)
    environment = dict(os.environ, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join([*pythonpath, ROOT, environment.get("PYTHONPATH", "")])
    command = [sys.executable, os.path.join(HERE, "_lightning_example_runner.py"), mode, out_dir,
               json.dumps(defaults or {}), program, *args]
    try:
        done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        returncode = -1
        output = f"{(expired.stdout or b'')[-2000:]!r}\nTimeoutError: did not finish in {timeout:.0f} s"
    records = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "losses-rank*.jsonl"))):
        rank = int(re.search(r"rank(\d+)", os.path.basename(path)).group(1))
        with open(path) as f:
            records[rank] = [json.loads(line) for line in f]
    return Run(returncode, output[-6000:], records)


def _weighted(rows: list[dict]) -> float:
    total = sum(row["n"] for row in rows)
    return sum(row["loss"] * row["n"] for row in rows) / total


def step_losses(records: dict[int, list[dict]], accumulate: int = 1) -> list[float]:
    """One loss per optimizer step, each the sample-weighted mean of its batches' losses: the ranks'
    ``i``-th batches (several ranks), or ``accumulate`` consecutive batches of one epoch (one rank)."""
    if len(records) > 1:
        per_rank = [records[rank] for rank in sorted(records)]
        if len({len(rows) for rows in per_rank}) != 1:
            raise ValueError(f"the ranks recorded {[len(rows) for rows in per_rank]} batches")
        return [_weighted(list(rows)) for rows in zip(*per_rank)]
    (rows,) = records.values()
    steps, current = [], []
    for row in rows:
        if current and (row["epoch"] != current[-1]["epoch"] or len(current) == accumulate):
            steps.append(_weighted(current))
            current = []
        current.append(row)
    if current:
        steps.append(_weighted(current))
    return steps


def compare(got: list[float], reference: list[float], rtol: float) -> tuple[bool, float]:
    """(every step within ``rtol`` of the reference and as many steps, the largest relative difference)."""
    if not reference or len(got) != len(reference):
        return False, float("inf")
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, reference))
    return worst <= rtol, worst
