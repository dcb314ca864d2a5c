"""The progress bar of Lightning's ``Trainer`` (a mixin of the mirror's ``Trainer``, ``trainer.py``):

- ``trainer.progress_bar_callback``: the ``ProgressBar`` among ``callbacks`` (at most one), else, unless
  ``enable_progress_bar=False`` (or ``barebones=True``), a ``TQDMProgressBar`` of the Trainer's own
  (not one of ``trainer.callbacks``, as the default checkpointing's ``ModelCheckpoint``); None when
  there is no bar. ``enable_progress_bar=False`` with a ``ProgressBar`` among the callbacks is
  Lightning's MisconfigurationException;
- ``trainer.progress_bar`` (whether the trainer's own tqdm bar is drawn on rank 0): as given while the
  bar is an enabled ``TQDMProgressBar``; off for a custom ``ProgressBar`` (it draws itself) or a
  disabled one;
- ``trainer.progress_bar_metrics``: the values ``self.log(..., prog_bar=True)`` gave, as Python
  numbers, under the names ``callback_metrics`` has for them (``name_step`` / ``name_epoch`` for a
  name logged both on_step and on_epoch), from the same values (the sanity check's are not kept),
  and the latest evaluation batch's ``on_step`` values, which ``callback_metrics`` lacks (as Lightning).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.api.errors import MisconfigurationException
from trainer.lightning.callbacks.progress import ProgressBar, TQDMProgressBar


class ProgressBarProperties:
    """``progress_bar_callback``, ``progress_bar`` and ``progress_bar_metrics`` (see the module)."""

    def _choose_progress_bar(self) -> None:
        """After the Trainer's own ``__init__``: the bar of the callbacks, else the default one."""
        bars = [callback for callback in self.callbacks if isinstance(callback, ProgressBar)]
        if len(bars) > 1:
            raise MisconfigurationException(
                f"callbacks hold {len(bars)} progress bars ({', '.join(type(bar).__name__ for bar in bars)}): a "
                "Trainer shows one; keep one of them")
        setting = self.__dict__.get("_progress_bar_setting")
        if bars and setting is False:
            raise MisconfigurationException(
                f"Trainer(enable_progress_bar=False) but callbacks hold a {type(bars[0]).__name__}: drop one of "
                "the two")
        bar = bars[0] if bars else (TQDMProgressBar() if setting is not False else None)
        if bar is not None:
            bar._trainer = self
        self.__dict__["_progress_bar_callback"] = bar

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        """The Trainer's progress bar callback (see the module); None without a bar."""
        return self.__dict__.get("_progress_bar_callback")

    @property
    def progress_bar(self) -> bool | None:
        """Whether the trainer draws its tqdm bar on rank 0 (None: when stderr is a terminal)."""
        bar = self.__dict__.get("_progress_bar_callback")
        if not isinstance(bar, TQDMProgressBar) or not bar.is_enabled:
            return False
        return self.__dict__.get("_progress_bar_setting")

    @progress_bar.setter
    def progress_bar(self, value: bool | None) -> None:
        self.__dict__["_progress_bar_setting"] = value

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        """The ``prog_bar=True`` values of the current (or last) call, as numbers (see the module)."""
        view = self._run_view
        if view is not None:
            names, steps = view.prog_bar_names, view.eval_step_values
        else:
            names, steps = self.__dict__.get("_prog_bar_names", frozenset()), self.__dict__.get("_eval_step_values", {})
        values = {**steps, **self.callback_metrics}
        return {name: value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
                for name, value in values.items() if name in names}
