"""Where the time goes: a DeepSpeed-style wall-clock breakdown of each step, and torch.profiler
traces over a range of steps (``trainer.profile.*``)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import ContextManager, Iterator

import torch

from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)

PHASES = ("data", "forward", "backward", "optimizer", "collectives")


_OFF = contextlib.nullcontext()  # (stateless: one object serves every block)


class WallClockBreakdown:
    """Sums the wall time of each phase of the steps between logging steps.

    On CUDA it synchronises at phase boundaries (kernels are asynchronous, so without it the time
    would land in whichever phase waits next): that costs speed, hence off by default. When
    disabled, ``phase`` is a no-op context and nothing is timed.
    """

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.device = device
        self._sums = dict.fromkeys(PHASES, 0.0)
        self._steps = 0
        self._step_start: float | None = None
        self._step_total = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def phase(self, name: str) -> ContextManager[None]:
        """Time the block as phase ``name``; off (the default), a shared no-op context: nothing per step."""
        return self._timed(name) if self.enabled else _OFF

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._sums[name] += time.perf_counter() - start

    def step_started(self) -> None:
        if self.enabled:
            self._sync()
            self._step_start = time.perf_counter()

    def step_finished(self) -> None:
        if self.enabled and self._step_start is not None:
            self._sync()
            self._step_total += time.perf_counter() - self._step_start
            self._steps += 1

    def metrics(self) -> dict[str, float]:
        """Mean milliseconds per step of each phase and of the whole step, since the last call."""
        if not self.enabled or self._steps == 0:
            return {}
        out = {f"time/{name}_ms": total * 1000 / self._steps for name, total in self._sums.items()}
        out["time/step_ms"] = self._step_total * 1000 / self._steps
        self._sums = dict.fromkeys(PHASES, 0.0)
        self._steps, self._step_total = 0, 0.0
        return out


class TraceWindow:
    """``torch.profiler`` over optimizer steps ``[first, last]`` (1-based, inclusive): a trace per
    rank viewable in TensorBoard (``tensorboard --logdir <run_dir>/profiler``) and a text summary
    of the most expensive operators with their FLOPs."""

    def __init__(self, steps: tuple[int, int] | None, run_dir: str, rank: int, device: torch.device):
        if steps is not None:
            first, last = steps
            if not (isinstance(first, int) and isinstance(last, int) and 1 <= first <= last):
                raise ValueError(f"trainer.profile.trace_steps={list(steps)!r}: give [first, last] with 1 <= first <= last")
        self.steps = steps
        self.folder = os.path.join(run_dir, "profiler")
        self.rank = rank
        self.device = device
        self._profiler: torch.profiler.profile | None = None
        self._first_step = self._last_step = 0  # the steps this run trained (after_step)
        self._written = False  # the whole window was traced

    def before_step(self, step: int) -> None:
        """``step``: the 1-based step about to run."""
        if self.steps is None or step != self.steps[0]:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        os.makedirs(self.folder, exist_ok=True)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, with_flops=True,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(self.folder, worker_name=f"rank{self.rank}"),
        )
        self._profiler.__enter__()

    def after_step(self, step: int) -> None:
        self._first_step = self._first_step or step
        self._last_step = step
        if self._profiler is None or step != self.steps[1]:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=30)
        with open(os.path.join(self.folder, f"summary_rank{self.rank}.txt"), "w", encoding="utf-8") as handle:
            handle.write(f"steps {self.steps[0]}..{self.steps[1]}, rank {self.rank}\n{table}\n")
        self._written = True

    def close(self) -> None:
        if self.steps is not None and not self._written:  # the run did not cover the window
            rank_zero_warn(log, "trainer.profile.trace_steps=%s: this run trained steps %s, %s", list(self.steps),
                           f"{self._first_step}..{self._last_step}" if self._first_step else "none",
                           "so no trace was written" if self._profiler is None
                           else "so the trace stops at the last one and has no summary")
            self.steps = None
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None
