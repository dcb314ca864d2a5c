"""Comms log: count, bytes and time of the collectives each rank issues over a window of steps
(``trainer.profile.comms_steps=[first,last]``), written per rank and summarised by rank 0.

``CollectiveRecorder`` does the recording, and is reusable on its own (tests use it to assert
which collectives a step makes): a ``TorchDispatchMode`` that sees every ``c10d`` operator, so
nothing in torch is replaced. Every way a collective is issued goes through those operators:
``torch.distributed``'s functions, point-to-point ``send`` / ``recv`` (also ``batch_isend_irecv``
and the pipeline schedules' ``P2POp`` batches), object collectives (each shows as its two tensor
collectives, sizes then payload), barriers, DDP's reducer (C++, during backward), FSDP's
all-gathers and reduce-scatters and DTensor's functional collectives. Checked on torch 2.13 / gloo
on the CPU (not on NCCL). ``torch.compile``d code runs eagerly while a dispatch mode is active, so
its collectives are seen, but the window's step times are eager ones. Not seen: a collective
issued on a thread that did not inherit the mode (autograd's threads do).

Kinds: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``reduce``, ``gather``,
``scatter``, ``all_to_all``, ``send_recv``, ``barrier`` (any other ``c10d`` operator under its own
name), and labelled all-reduces: ``GRADIENT_KIND`` (gradient averaging: an all-reduce issued
during backward, as DDP's reducer does, or one the strategy labels, as pipeline's data-parallel
gradient sync), ``SYNC_BN_KIND`` (synchronised batch norm statistics), ``TOKEN_COUNT_KIND`` (the
global token count of ``loss_normalization=tokens``) and ``OVERFLOW_KIND`` (fp16's overflow agreement). ``gradient_rounds``
counts the backward passes (or labelled syncs) that averaged gradients: one per optimizer step
when accumulation skips the sync on the other micro-batches. Bytes are the largest tensor among
the operator's arguments (the payload; for a gather, the gathered output). Time is the time spent
in the call (for asynchronous operations, only the launch).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

#: c10d operator name -> kind in the log (unlisted c10d operators are logged under their own name)
KINDS = {
    **dict.fromkeys(["allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_", "all_reduce_coalesced",
                     "all_reduce_coalesced_"], "all_reduce"),
    **dict.fromkeys(["allgather_", "_allgather_base_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
                     "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced"],
                    "all_gather"),
    **dict.fromkeys(["reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_",
                     "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"], "reduce_scatter"),
    **dict.fromkeys(["broadcast_", "broadcast"], "broadcast"),
    **dict.fromkeys(["alltoall_", "alltoall_base_", "all_to_all_single"], "all_to_all"),
    **dict.fromkeys(["send", "recv_", "recv_any_source_"], "send_recv"),
    **dict.fromkeys(["barrier", "monitored_barrier_"], "barrier"),
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
}
#: c10d operators that move no data (waiting on a functional collective's result)
NOT_COLLECTIVES = {"wait_tensor"}
NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
GRADIENT_KIND = "all_reduce (gradients)"
SYNC_BN_KIND = "all_reduce (sync batch norm)"
TOKEN_COUNT_KIND = "all_reduce (token count)"
OVERFLOW_KIND = "all_reduce (fp16 overflow)"

_active: CollectiveRecorder | None = None
_label: str | None = None


def _largest_tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return max((_largest_tensor_bytes(v) for v in values), default=0)
    if isinstance(values, dict):
        return _largest_tensor_bytes(list(values.values()))
    return 0


@contextlib.contextmanager
def labelled(kind: str) -> Iterator[None]:
    """Collectives issued inside are logged as ``kind`` (``GRADIENT_KIND``: one gradient round)
    while a recorder is active; costs a check of one global otherwise."""
    global _label
    if _active is None:
        yield
        return
    previous, _label = _label, kind
    if kind == GRADIENT_KIND:
        _active.gradient_rounds += 1
    try:
        yield
    finally:
        _label = previous


class CollectiveRecorder(TorchDispatchMode):
    """Records every collective issued on this thread (and by autograd for it) while entered.

    >>> with CollectiveRecorder() as recorder:
    ...     train_one_step()
    >>> recorder.counts        # {"all_reduce (gradients)": {"count": 2, "bytes": ..., "seconds": ...}, ...}

    One recorder at a time: entering a second while one is active is an error.
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, dict[str, float]] = {}
        self.gradient_rounds = 0
        self._backward_tasks: set[int] = set()

    def record(self, kind: str, nbytes: int, seconds: float) -> None:
        entry = self.counts.setdefault(kind, {"count": 0, "bytes": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["bytes"] += nbytes
        entry["seconds"] += seconds

    def __enter__(self) -> CollectiveRecorder:
        global _active
        if _active is not None:
            raise RuntimeError("a CollectiveRecorder is already recording; nest none inside another")
        _active = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        global _active
        _active = None
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if func.namespace not in NAMESPACES or name in NOT_COLLECTIVES:
            return func(*args, **kwargs)
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            kind = KINDS.get(name, name)
            if _label is not None:
                kind = _label
            elif kind == "all_reduce":
                task = torch._C._current_graph_task_id()
                if task != -1:  # during backward: DDP's reducer averaging gradients
                    kind = GRADIENT_KIND
                    if task not in self._backward_tasks:
                        self._backward_tasks.add(task)
                        self.gradient_rounds += 1
            self.record(kind, _largest_tensor_bytes([args, kwargs]), time.perf_counter() - start)


class CommsLog:
    """Records collectives between ``before_step(first)`` and ``after_step(last)``."""

    def __init__(self, steps: tuple[int, int] | None, run_dir: str, rank: int):
        self.steps = steps
        self.folder = os.path.join(run_dir, "comms")
        self.rank = rank
        self.recorder: CollectiveRecorder | None = None
        self._written = False

    @property
    def enabled(self) -> bool:
        return self.steps is not None

    def before_step(self, step: int) -> None:
        if not self.enabled or step != self.steps[0]:
            return
        self.recorder = CollectiveRecorder()
        self.recorder.__enter__()

    def after_step(self, step: int) -> None:
        if not self.enabled or step != self.steps[1] or self.recorder is None:
            return
        recorder = self._stop()
        self._write(recorder)
        self._written = True

    def _stop(self) -> CollectiveRecorder | None:
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            recorder.__exit__(None, None, None)
        return recorder

    def close(self) -> None:
        """At the end of training: a window the run never finished is said, not silently dropped."""
        self._stop()
        if self.enabled and not self._written:
            from trainer.runtime.rank_logging import rank_zero_warn

            rank_zero_warn(log, "trainer.profile.comms_steps=%s: the run ended before step %d, so no comms log "
                           "was written; choose steps the run trains", list(self.steps), self.steps[1])

    def _write(self, recorder: CollectiveRecorder) -> None:
        from trainer.runtime import distributed

        first, last = self.steps
        mine = {"rank": self.rank, "steps": [first, last], "kinds": recorder.counts,
                "gradient_rounds": recorder.gradient_rounds}
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
