"""The rank-0 progress bar: steps, loss on logging steps, it/s. Off when stderr is not a TTY."""

from __future__ import annotations

import sys
from typing import Mapping


class ProgressBar:
    def __init__(self, total: int | None, enabled: bool | None, initial: int = 0):
        self._bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def update(self, metrics: Mapping[str, float] | None) -> None:
        if self._bar is None:
            return
        if metrics is not None and "train/loss" in metrics:
            self._bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
