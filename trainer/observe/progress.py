"""Progress bars on rank 0: training (steps, loss, lr, samples/s) and validation (batches).
Off when stderr is not a terminal, so log files stay clean (``trainer.progress_bar`` forces it)."""

from __future__ import annotations

import sys
from typing import Mapping

# Shown in the bar when a logging step has them: metric -> label, format.
SHOWN = {"train/loss": ("loss", "{:.4f}"), "train/lr": ("lr", "{:.3g}"), "perf/samples_per_s": ("samples/s", "{:.1f}")}


class ProgressBar:
    """A tqdm bar, or nothing. ``enabled=None``: only when stderr is a terminal."""

    def __init__(self, total: int | None, enabled: bool | None, initial: int = 0, desc: str = "train",
                 unit: str = "step", leave: bool = True):
        self._bar = None
        self.also_show: set[str] = set()  # more metric names to show as they are (self.log's prog_bar=True)
        #: the trainer's own values where the user logs the same names (its returned loss is shown as "loss")
        self.own_values: Mapping[str, float] = {}
        self._postfix: dict[str, str] = {}  # what the bar shows, kept until a newer value comes
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave)

    @property
    def shown(self) -> bool:
        """Whether there is a bar (off: updating it is skipped)."""
        return self._bar is not None

    def update(self, metrics: Mapping[str, float] | None = None, steps: int = 1) -> None:
        """Advance by ``steps`` (optimizer steps of a manual run's batch), showing ``metrics``."""
        if self._bar is None:
            return
        self.note(metrics)
        self._bar.update(steps)

    def note(self, metrics: Mapping[str, float] | None) -> None:
        """Show the values of ``metrics`` the bar shows (e.g. a validation's), without advancing."""
        if self._bar is None or not metrics:
            return
        own = {**metrics, **self.own_values}
        shown = {label: fmt.format(own[key]) for key, (label, fmt) in SHOWN.items() if key in own}
        shown.update({key: f"{metrics[key]:.4g}" for key in sorted(self.also_show) if key in metrics})
        if shown:
            self._postfix.update(shown)
            self._bar.set_postfix(self._postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
