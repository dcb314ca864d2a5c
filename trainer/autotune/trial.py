"""One trial: ``python -m trainer <overrides>`` in its own process group, a few steps, measured.

Isolation: a candidate that crashes, runs out of memory or is killed is a row ``failed: <reason>``;
the autotuner goes on with the next one.

Throughput is read from what the trainer logs (trainer/observe/throughput.py via the jsonl logger): each
logging step logs ``perf/step_time_s`` and ``perf/samples_per_s`` over the steps since the previous
one. A trial logs every ``warmup_steps`` steps and runs ``warmup_steps + steps``; the first window
(the warm-up, with the first step's one-off costs) is dropped and the rest are summed:
samples/s = samples of the measured steps / their wall time.

Peak memory: on CUDA the trainer's logged ``memory/peak_allocated_gb`` (rank 0's
``torch.cuda.max_memory_allocated``). On CPU the peak resident set size of the largest process of
the trial (the launcher and its rank processes), which ``os.wait4`` returns for the reaped process
tree (Linux counts waited-for descendants in ``ru_maxrss``); it includes the Python interpreter and
torch itself (a few hundred MB), so it compares candidates rather than sizing the model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer.autotune.candidates import Candidate
from trainer.autotune.settings import TRAIN_COMMAND, Settings

LOG_NAME = "autotune_trial.log"  # the trial's stdout and stderr, in its run directory
METRICS_NAME = "metrics.jsonl"


@dataclass
class TrialResult:
    """One row of the table. ``status``: ``ok``, ``failed: <reason>`` or ``not run: budget``."""

    candidate: Candidate
    status: str
    samples_per_s: float | None = None
    peak_mb: float | None = None
    memory: str | None = None  # what peak_mb measures
    seconds: float | None = None  # wall time of the trial process
    run_dir: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def measurement_overrides(settings: Settings, run_dir: Path) -> list[str]:
    """What every trial adds after the user's and the candidate's overrides (the last value wins):
    the step count and logging window, no checkpoints, only the jsonl logger (the measurement),
    no callbacks, validation cut to one batch at the end, nothing resumed, no weights copied back."""
    return [
        f"trainer.max_steps={settings.warmup_steps + settings.steps}", "trainer.max_epochs=null", "trainer.max_time=null",
        "trainer.limit_train_batches=null", f"trainer.log_every_n_steps={settings.warmup_steps}",
        "trainer.val_every_n_steps=null", "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=null",
        "trainer.num_sanity_val_steps=0", "trainer.limit_val_batches=1", "trainer.fast_dev_run=false",
        "trainer.enable_model_summary=false", "trainer.progress_bar=false", "trainer.resume=null",
        "trainer.return_weights=false",
        "checkpoint.save_last=false", "checkpoint.every_n_steps=null", "checkpoint.every_n_epochs=null",
        "logger=[jsonl]", f"logger.jsonl.filename={METRICS_NAME}", "callbacks=[]",
        f"hydra.run.dir={run_dir}",
    ]


def read_throughput(metrics_path: Path) -> tuple[float, int]:
    """``(samples/s, measured steps)`` over the logged windows after the first (see the module
    docstring). Raises ``ValueError`` when fewer than two windows were logged."""
    windows = []
    with open(metrics_path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if "perf/samples_per_s" in record:
                windows.append((record["step"], record["perf/step_time_s"], record["perf/samples_per_s"]))
    windows.sort()
    if len(windows) < 2:
        raise ValueError(f"{len(windows)} logged window(s) in {metrics_path}: need the warm-up and one measured")
    seconds = samples = 0.0
    for (before, _, _), (step, step_time, rate) in zip(windows, windows[1:]):
        elapsed = step_time * (step - before)
        seconds += elapsed
        samples += rate * elapsed
    return samples / seconds, windows[-1][0] - windows[0][0]


def logged_cuda_peak_mb(metrics_path: Path) -> float | None:
    """The largest ``memory/peak_allocated_gb`` the trial logged (CUDA), in MB; None on CPU."""
    peaks = []
    with open(metrics_path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if "memory/peak_allocated_gb" in record:
                peaks.append(record["memory/peak_allocated_gb"] * 1e3)
    return max(peaks) if peaks else None


def failure_reason(log_path: Path, limit: int = 160) -> str:
    """The line of the trial's output that says why it failed: the trainer's one-line ``error:``,
    else the last line naming an error, else the last line."""
    try:
        lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    if not lines:
        return "no output"
    chosen = next((line for line in reversed(lines) if line.startswith("error:")), None)
    chosen = chosen or next((line for line in reversed(lines) if "Error" in line or "WorkerFailed" in line), lines[-1])
    return chosen if len(chosen) <= limit else chosen[: limit - 3] + "..."


def _kill_group(pid: int) -> None:
    """SIGKILL the trial's process group: the launcher and the ranks it spawned (they share it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # all of it ended meanwhile
        pass


def _wait(process: subprocess.Popen, timeout_s: float) -> tuple[int, float, bool]:
    """``(wait status, peak RSS in MB, timed out)``: polls ``os.wait4`` (whose rusage covers the reaped
    tree); past ``timeout_s`` the whole process group is killed."""
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() >= deadline:
            timed_out = True
            _kill_group(process.pid)
            _, status, usage = os.wait4(process.pid, 0)
            break
        time.sleep(0.05)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    return status, usage.ru_maxrss * scale / 1e6, timed_out


def run_trial(candidate: Candidate, overrides: list[str], settings: Settings, run_dir: Path, timeout_s: float) -> TrialResult:
    """Run ``candidate`` with the user's ``overrides`` for at most ``timeout_s`` seconds and measure it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_NAME).unlink(missing_ok=True)  # the logger appends: no windows from an earlier search
    command = [*TRAIN_COMMAND, *overrides, *candidate.overrides(), *measurement_overrides(settings, run_dir)]
    log_path = run_dir / LOG_NAME
    started = time.monotonic()
    with open(log_path, "wb") as log:
        log.write((" ".join(command) + "\n").encode())
        log.flush()
        # Its own session: one killpg ends the launcher and the ranks it spawned. Workers use
        # cores // devices threads each (the trainer's rule), as the real run will.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        try:
            status, rss_mb, timed_out = _wait(process, timeout_s)
        except BaseException:  # interrupted: leave no trial behind
            if process.returncode is None:
                _kill_group(process.pid)
                os.waitpid(process.pid, 0)
            raise
    seconds = time.monotonic() - started
    result = TrialResult(candidate, "ok", seconds=seconds, run_dir=str(run_dir))
    if timed_out:
        result.status = f"failed: stopped at the time budget after {seconds:.0f} s"
        return result
    if process.returncode != 0:
        code = process.returncode
        why = f"killed by signal {-code}{' (out of memory?)' if code == -signal.SIGKILL else ''}" if code < 0 \
            else failure_reason(log_path)
        result.status = f"failed: {why}"
        return result
    metrics = run_dir / METRICS_NAME
    try:
        result.samples_per_s, result.extra["measured_steps"] = read_throughput(metrics)
        cuda_peak = logged_cuda_peak_mb(metrics)
    except (OSError, ValueError, KeyError) as error:
        result.status = f"failed: no throughput measured ({error})"
        return result
    if cuda_peak is not None:
        result.peak_mb, result.memory = cuda_peak, "CUDA max_memory_allocated, rank 0"
    else:
        result.peak_mb, result.memory = rss_mb, "peak RSS of the largest trial process (os.wait4)"
    return result
