"""The trainer's own Python work per quiet step, counted (never timed): the calls of its functions and
the built-ins they call, under ``sys.setprofile``. A budget a little above today's count keeps the
per-step overhead where it is; the test also shows that the budget catches the regressions it is
there for: a step's plan computed twice, and the permutation evaluated per index in Python."""

from __future__ import annotations

import gc
import os
import sys

import torch
from torch.utils.data import TensorDataset

import trainer
from trainer import Trainer, TrainModule
from trainer.data import batch_plan, permutation

TRAINER_DIR = os.path.dirname(os.path.abspath(trainer.__file__)) + os.sep
BATCH = 32  # a permutation chunk holds 4096 // 32 = 128 steps' positions
SHORT, LONG = 8, 8 + 128  # the difference holds one whole chunk and two non-finite check windows
# The trainer's calls per quiet step (one process, one micro-batch of 32 from a TensorDataset, SGD, no
# callbacks, nothing logged): 98.75 today (128.75 while the batch was read per sample, 32 of them the
# dataset's __getitem__; 180 before the quiet step's short way); a plan computed twice adds about 14, the
# permutation per index in Python about 65. Two calls more per quiet step go over the budget.
BUDGET = 100


class _Linear(TrainModule):
    def __init__(self):
        super().__init__(optimizer=lambda params: torch.optim.SGD(params, lr=0.01))
        self.net = torch.nn.Linear(4, 1)

    def train_dataset(self):
        generator = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(8192, 4, generator=generator), torch.randn(8192, 1, generator=generator))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)


def _trainer_events(steps: int, run_dir: str) -> int:
    """Profiler events of a ``steps``-step fit that are the trainer's work: calls of its functions
    (and resumptions of its generators) and every call its code makes (built-ins, context managers'
    ``__enter__`` / ``__exit__``, torch's Python functions, the module's hooks)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "c_call":
            count += frame.f_code.co_filename.startswith(TRAINER_DIR)
        elif event == "call":
            caller = frame.f_back
            count += frame.f_code.co_filename.startswith(TRAINER_DIR) or (
                caller is not None and caller.f_code.co_filename.startswith(TRAINER_DIR))

    fit = Trainer(max_steps=steps, batch_size=BATCH, log_every_n_steps=10_000, loggers=[], progress_bar=False,
                  checkpoint=None, enable_model_summary=False, num_sanity_val_steps=0, run_dir=run_dir)
    module = _Linear()
    gc.collect()
    gc.disable()  # (a collection would run finalizers inside the count, wherever it happens to fall)
    sys.setprofile(profile)
    try:
        fit.fit(module)
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


def trainer_work_per_step(run_dir) -> float:
    """The trainer's events per quiet step: two fits that differ by ``LONG - SHORT`` quiet steps
    (the last step of each logs: the same work in both), after a fit that pays what a process does
    once (lazy imports, first-call caches)."""
    _trainer_events(2, str(run_dir / "first"))
    return (_trainer_events(LONG, str(run_dir / "long")) - _trainer_events(SHORT, str(run_dir / "short"))) / (LONG - SHORT)


def test_a_quiet_step_stays_within_its_budget_of_python_work(tmp_path, monkeypatch):
    work = trainer_work_per_step(tmp_path / "now")
    assert work <= BUDGET, f"{work:.1f} calls per quiet step in the trainer's code, budget {BUDGET}"

    # A step's plan computed twice (for the step loop and again for its loader): over the budget.
    with monkeypatch.context() as patched:
        patched.setattr(batch_plan, "_RECENT_STEPS", 0)  # nothing kept: each request computes it again
        twice = trainer_work_per_step(tmp_path / "twice")
    assert twice > BUDGET, (twice, work)

    # The permutation evaluated per index in Python ints: over the budget.
    def per_index(self, start, stop):
        return torch.tensor([self.at(position) for position in range(start, min(stop, self.n))], dtype=torch.int64)

    with monkeypatch.context() as patched:
        patched.setattr(permutation.IndexPermutation, "range", per_index)
        per_index_work = trainer_work_per_step(tmp_path / "per_index")
    assert per_index_work > BUDGET, (per_index_work, work)
