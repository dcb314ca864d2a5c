"""Runs of the Lightning-idiom programs, each done once and shared by the tests that read it.

``ProgramRuns(root).get(name, side, devices, strategy)`` runs the program on first use and returns the
same :class:`~tests.support.lightning_oracle.ProgramRun` afterwards; a run that failed raises its error
again on every use (so each test that needs it fails, or xfails, with the real cause).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from tests.support.lightning_oracle import ProgramRun, run_program
from trainer.trainer import Trainer


@contextlib.contextmanager
def logging_every_step(on: bool) -> Iterator[None]:
    """Every Trainer a program builds inside makes each step a logging step (``log_every_n_steps = 1``),
    set when it is built: the Trainer is read-only once its run is live."""
    if not on:
        yield
        return
    original = Trainer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.log_every_n_steps = 1

    Trainer.__init__ = init
    try:
        yield
    finally:
        Trainer.__init__ = original


class ProgramRuns:
    def __init__(self, root: str):
        self.root = str(root)
        self._done: dict[tuple, Any] = {}

    def get(self, name: str, side: str, devices: int = 1, strategy: str = "auto", every_step_logged: bool = False) -> ProgramRun:
        """``every_step_logged`` (this trainer only): every step is a logging step, so the step values in
        ``callback_metrics`` are reduced over the ranks at every step (between logging steps each rank
        shows its own, with no collective: equal to one process only where they are reduced)."""
        key = (name, side, devices, strategy, every_step_logged)
        if key not in self._done:
            run_dir = os.path.join(self.root, f"{name}-{side}-{strategy}-{devices}{'-every-step' if every_step_logged else ''}")
            try:
                with logging_every_step(every_step_logged and side != "lightning"):
                    self._done[key] = run_program(name, side, run_dir, devices=devices, strategy=strategy)
            except Exception as error:  # kept: every test that needs this run sees the same error
                self._done[key] = error
        done = self._done[key]
        if isinstance(done, Exception):
            raise done
        return done
