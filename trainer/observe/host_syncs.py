"""Counting what a training step costs besides its math: host syncs (``HostSyncCounter``) and
collectives by kind (``HotPathProbe``, a callback writing per-step windows), on any device (a CPU
run counts the syncs a GPU run would make). Used by the hot-path tests and ``bench/hot_path.py``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.utils._python_dispatch

from trainer.api.callback import Callback, run_of
from trainer.runtime.comms_log import CollectiveRecorder

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # trainer/

class HostSyncCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts host syncs: ``aten._local_scalar_dense`` calls (``.item()``,
    ``bool(t)``, ``float(t)``, ``int(t)``) made outside ``torch.optim`` (a stock AdamW reads its CPU step
    counter with ``.item()``: no device sync), plus ``.tolist()`` / ``.numpy()`` of tensors and
    ``.cpu()`` of tensors that are not on the CPU. ``where`` names the caller of each (file:line).

    Not counted: ``.tolist()`` in the data plan (``trainer/data/batch_plan.py``, ``trainer/data/permutation.py``),
    which turns the plan's own CPU index tensors into a loader's sample indices: no tensor the step
    produced, never on a device."""

    #: callers (path endings) whose ``.tolist()`` reads CPU-only index tensors (see above)
    DATA_PLAN = (os.path.join(_PACKAGE, "data", "batch_plan.py"), os.path.join(_PACKAGE, "data", "permutation.py"))
    #: frames skipped when naming the caller
    PLUMBING = (os.sep + "torch" + os.sep, os.path.abspath(__file__), os.path.join(_PACKAGE, "runtime", "comms_log.py"))

    def __init__(self):
        super().__init__()
        self.count = 0
        self.where: list[str] = []
        self._patched: dict[str, Any] = {}

    def _caller(self):
        frame = sys._getframe(2)
        while frame is not None and any(part in frame.f_code.co_filename for part in self.PLUMBING):
            frame = frame.f_back
        return frame

    def _note(self, tolist: bool = False) -> None:
        frame = self._caller()
        if tolist and frame is not None and frame.f_code.co_filename.endswith(self.DATA_PLAN):
            return
        self.count += 1
        self.where.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else "?")

    @staticmethod
    def _in_optimizer() -> bool:
        # Also the DataLoader's per-epoch base seed (``.item()`` of a CPU generator's draw): CPU only.
        frame = sys._getframe(2)
        while frame is not None:
            if f"torch{os.sep}optim{os.sep}" in frame.f_code.co_filename or \
                    os.path.join("torch", "utils", "data", "") in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not self._in_optimizer():
            self._note()
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        counter = self
        for name in ("tolist", "numpy", "cpu"):
            original = getattr(torch.Tensor, name)
            self._patched[name] = torch.Tensor.__dict__.get(name)

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                if _name != "cpu" or tensor.device.type != "cpu":
                    counter._note(tolist=_name != "cpu")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
        self._patched = {}
        return super().__exit__(*exc)


class HotPathProbe(Callback):
    """Counts host syncs (``HostSyncCounter``) and collectives (``CollectiveRecorder``) between
    consecutive ``on_train_step_end`` calls, on every rank: the window ending at step k holds what
    followed step k-1's end hook (its validation, checkpoint and preemption check) and step k. Writes
    ``hot_path_rank{r}.json``: ``{step: {"syncs": n, "where": [...], "collectives": {kind: count}}}``."""

    def __init__(self):
        self.windows: dict[int, dict] = {}
        self._modes: tuple | None = None

    def _start(self) -> None:
        syncs, collectives = HostSyncCounter(), CollectiveRecorder()
        syncs.__enter__()
        collectives.__enter__()
        self._modes = (syncs, collectives)

    def _stop(self) -> tuple | None:
        modes, self._modes = self._modes, None
        if modes is not None:
            modes[1].__exit__(None, None, None)
            modes[0].__exit__(None, None, None)
        return modes

    def on_fit_start(self, trainer, module):
        self._start()

    def on_train_step_end(self, trainer, module, step, metrics):
        syncs, collectives = self._stop()
        self.windows[step] = {"syncs": syncs.count, "where": syncs.where,
                              "collectives": {k: v["count"] for k, v in collectives.counts.items()}}
        self._start()

    def on_fit_end(self, trainer, module):
        run = run_of(trainer)
        self._stop()
        with open(os.path.join(run.run_dir, f"hot_path_rank{run.rank}.json"), "w") as f:
            json.dump(self.windows, f)


def read_hot_path(run_dir: str, world_size: int) -> list[dict[int, dict]]:
    """``HotPathProbe``'s windows of every rank, keyed by step."""
    ranks = []
    for rank in range(world_size):
        with open(os.path.join(str(run_dir), f"hot_path_rank{rank}.json")) as f:
            ranks.append({int(k): v for k, v in json.load(f).items()})
    return ranks
