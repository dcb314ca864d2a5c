"""Whole-process runs in pairs (A B A B ...), each contender's figure taken over the baseline's of the
same round: the timing machinery of the bench scripts that compare a contender with a hand-written
loop run by run."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import tempfile
import time
from typing import Callable


def _become_subreaper() -> bool:
    """Linux: orphans of the processes started here (a launcher's workers, a fork server's children)
    are reaped by this process, so their CPU time is counted in its children's usage."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


SUBREAPER = _become_subreaper()


def _wait_for_orphans(limit_s: float = 60.0) -> bool:
    """True once every adopted orphan has exited (within ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def run_once(command: list[str], cwd: str, done_marker: str | None = None) -> dict:
    """``command`` in a fresh process, timed from its start to its exit: ``wall_s``, ``cpu_s`` (its own
    and its descendants'; None where they could not all be reaped), ``peak_rss_mb``, ``exit_code``.
    A non-zero exit is an error unless the output holds ``done_marker`` (a gloo rank may abort at
    interpreter exit after its last step)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as output:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=cwd)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        reaped = _wait_for_orphans() and SUBREAPER
        output.seek(0)
        text = output.read().decode(errors="replace")
    if code != 0 and not (done_marker and done_marker in text):
        raise RuntimeError(f"{' '.join(command)} exited with {code}:\n{text[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu if reaped else None, "peak_rss_mb": usage.ru_maxrss / 1024, "exit_code": code}


def spread(values: list[float]) -> dict:
    """median, min and max (what the tables print)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(run: Callable[[str], dict], contenders: list[str], pairs: int, warmup: int, label: str = "") -> dict:
    """``warmup`` uncounted rounds, then ``pairs`` rounds of every contender in turn (``run(name)`` times
    one); ``contenders[0]`` is the baseline. Returns the runs and, per other contender, its wall and CPU
    ratios to the baseline of the same round with their spread."""
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for round_ in range(warmup + pairs):
        for name in contenders:
            figures = run(name)
            counted = round_ >= warmup
            if counted:
                runs[name].append(figures)
            cpu = "unknown" if figures["cpu_s"] is None else f"{figures['cpu_s']:.2f} s"
            print(f"  {label}{'pair ' + str(round_ - warmup + 1) if counted else 'warm-up'}, {name}: wall "
                  f"{figures['wall_s']:.2f} s, cpu {cpu} (load average {os.getloadavg()[0]:.2f})", flush=True)
    base = runs[contenders[0]]
    ratios = {}
    for name in contenders[1:]:
        wall = [r["wall_s"] / b["wall_s"] for r, b in zip(runs[name], base)]
        cpu = [r["cpu_s"] / b["cpu_s"] for r, b in zip(runs[name], base) if r["cpu_s"] and b["cpu_s"]]
        ratios[name] = {"wall": {"pairs": wall, **spread(wall)},
                        "cpu": {"pairs": cpu, **spread(cpu)} if cpu and len(cpu) == len(wall) else None}
    return {"baseline": contenders[0], "runs": runs, "ratios": ratios}
