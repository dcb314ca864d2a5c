"""Comms log: count, bytes and time of the collectives each rank issues over a window of steps
(``trainer.profile.comms_steps=[first,last]``), written per rank and summarised by rank 0.

Collectives called from Python (FSDP's all-gathers and reduce-scatters, the trainer's metric
reductions, pipeline send/recv) are seen by wrapping ``torch.distributed``'s functions during the
window. DDP all-reduces gradients from C++; with the log on, the DDP strategy routes them through
a comm hook that records each bucket and each *round* (one backward's worth of buckets), which
shows directly that accumulation syncs once per optimizer step. Time is the time spent in the
call (for asynchronous operations, only the launch).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

#: torch.distributed function -> kind in the log
KINDS = {
    "all_reduce": "all_reduce",
    "reduce": "reduce",
    "broadcast": "broadcast",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send_recv",
    "recv": "send_recv",
    "isend": "send_recv",
    "irecv": "send_recv",
}
GRADIENT_KIND = "all_reduce (DDP gradients)"

_active: CommsLog | None = None


def _tensor_bytes(args: tuple, kwargs: dict) -> int:
    """The largest tensor among the arguments (the payload of the collective)."""
    largest = 0
    for value in list(args) + list(kwargs.values()):
        tensors = value if isinstance(value, (list, tuple)) else [value]
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                largest = max(largest, tensor.numel() * tensor.element_size())
    return largest


class CommsLog:
    """Records collectives between ``before_step(first)`` and ``after_step(last)``."""

    def __init__(self, steps: tuple[int, int] | None, run_dir: str, rank: int):
        self.steps = steps
        self.folder = os.path.join(run_dir, "comms")
        self.rank = rank
        self.counts: dict[str, dict[str, float]] = {}
        self.gradient_rounds = 0
        self._originals: dict[str, Callable] = {}

    @property
    def enabled(self) -> bool:
        return self.steps is not None

    def record(self, kind: str, nbytes: int, seconds: float) -> None:
        entry = self.counts.setdefault(kind, {"count": 0, "bytes": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["bytes"] += nbytes
        entry["seconds"] += seconds

    def _wrap(self, name: str, original: Callable) -> Callable:
        kind = KINDS[name]

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.record(kind, _tensor_bytes(args, kwargs), time.perf_counter() - start)

        return counted

    def before_step(self, step: int) -> None:
        global _active
        if not self.enabled or step != self.steps[0]:
            return
        for name in KINDS:
            original = getattr(dist, name, None)
            if original is not None:
                self._originals[name] = original
                setattr(dist, name, self._wrap(name, original))
        _active = self

    def after_step(self, step: int) -> None:
        if not self.enabled or step != self.steps[1] or not self._originals:
            return
        self._restore()
        self._write()

    def _restore(self) -> None:
        global _active
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}
        _active = None

    def close(self) -> None:
        if self._originals:
            self._restore()

    def _write(self) -> None:
        from trainer import distributed

        first, last = self.steps
        mine = {"rank": self.rank, "steps": [first, last], "kinds": self.counts, "gradient_rounds": self.gradient_rounds}
        os.makedirs(self.folder, exist_ok=True)
        with open(os.path.join(self.folder, f"rank{self.rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(mine, handle, indent=1)
        everyone = distributed.all_gather_object(mine)  # after the window: not counted
        if self.rank != 0:
            return
        summary: dict[str, dict[str, float]] = {}
        for report in everyone:
            for kind, entry in report["kinds"].items():
                total = summary.setdefault(kind, {"count": 0, "bytes": 0, "seconds": 0.0})
                for key in total:
                    total[key] += entry[key]
        steps = last - first + 1
        with open(os.path.join(self.folder, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump({"steps": [first, last], "ranks": len(everyone), "kinds": summary}, handle, indent=1)
        lines = [f"comms over steps {first}..{last} ({len(everyone)} ranks), per step and rank:"]
        for kind, total in sorted(summary.items()):
            per = steps * len(everyone)
            lines.append(f"  {kind:28s} {total['count'] / per:8.1f} calls  {total['bytes'] / per / 1e6:10.3f} MB  "
                         f"{total['seconds'] / per * 1000:8.2f} ms")
        log.info("\n".join(lines))


def ddp_gradient_hook(state, bucket):  # noqa: ANN001, ANN201 - DDP rejects string annotations here
    """DDP comm hook: the default all-reduce (average), recorded while a comms log is active.
    Left unannotated on purpose: DDP checks the annotations against its classes, and this module's
    postponed annotations are strings."""
    recorder = _active
    buffer = bucket.buffer()
    all_reduce = dist.all_reduce
    if recorder is not None:
        recorder.record(GRADIENT_KIND, buffer.numel() * buffer.element_size(), 0.0)
        if bucket.is_last():
            recorder.gradient_rounds += 1
        all_reduce = recorder._originals.get("all_reduce", all_reduce)  # counted above, not again
    # What DDP's default hook does: average over the ranks, asynchronously.
    buffer.div_(dist.get_world_size())
    return all_reduce(buffer, async_op=True).get_future().then(lambda future: future.value()[0])
