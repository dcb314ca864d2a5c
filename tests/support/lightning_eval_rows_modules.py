"""Modules and a callback for the tests of what evaluation batches log under Lightning's ``Trainer``
(tests/unit/api/test_lightning_eval_step_rows.py, with Lightning as the oracle, and the 2-rank
counterpart tests/multiprocess/api/test_lightning_eval_rows_ranks.py). Written once for both packages,
as in tests/support/lightning_loop_modules.py; the classes for our side are defined at module level,
so spawned ranks can import them."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as ours
from tests.support.lightning_loop_modules import ModuleSteps


class LoadersStepSteps(ModuleSteps):
    """``val_dataloader()`` / ``test_dataloader()``: a list of ``options["loaders"]`` loaders (5 and 3
    samples; ``options["single"]``: the first one, not in a list); the steps log ``on_step`` values
    (``name`` alone, and ``both`` with ``on_epoch=True``), in epoch 1 (``options["late"]``: in every
    epoch) not in a pass's first batch, and record the ``dataloader_idx`` they get."""

    def validation_step(self, batch, batch_idx, dataloader_idx=None):
        self.calls.append(("validation_step", batch_idx, dataloader_idx))
        if batch_idx != 0 or (self.current_epoch != 1 and not self.options.get("late")):  # (a batch without values counts on the rows' step axis)
            output = self.layer(batch[0])
            self.log("vstep", output.mean(), on_step=True, on_epoch=False)
            self.log("vboth", output.sum(), on_step=True, on_epoch=True, reduce_fx="sum")

    def test_step(self, batch, batch_idx, dataloader_idx=None):
        self.calls.append(("test_step", batch_idx, dataloader_idx))
        self.log("tstep", self.layer(batch[0]).mean(), on_step=True, on_epoch=False)

    def _loaders(self):
        size = self.options.get("eval_batch", 2)
        first = DataLoader(TensorDataset(torch.arange(10.0).view(5, 2) / 10), batch_size=size)
        second = DataLoader(TensorDataset(torch.arange(6.0).view(3, 2) + 1), batch_size=size)
        if self.options.get("single"):
            return first
        return [first, second][:self.options.get("loaders", 2)]

    val_dataloader = test_dataloader = _loaders


class StepLogsInHooks:
    """A callback's hooks that log each ``on_step`` / ``on_epoch`` / ``prog_bar`` / ``logger``
    combination in the validation batch and epoch hooks (Lightning's own test does this), each value
    the same on every rank (``index + 100 * batch_idx``)."""

    def _log(self, module: Any, hook: str, on_steps: tuple, on_epochs: tuple, batch_idx: int = 0) -> None:
        for idx, (on_step, on_epoch, prog_bar, logger) in enumerate(
                itertools.product(on_steps, on_epochs, (False, True), (False, True))):
            if on_step or on_epoch:
                module.log(f"{hook}_{idx}", float(idx + 100 * batch_idx), on_step=on_step, on_epoch=on_epoch,
                           prog_bar=prog_bar, logger=logger)

    def on_validation_epoch_start(self, trainer, module):
        self._log(module, "epoch_start", (False,), (True,))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self._log(module, "batch_end", (False, True), (False, True), batch_idx)

    def on_validation_epoch_end(self, trainer, module):
        self._log(module, "epoch_end", (False,), (True,))


class HparamsSteps(ModuleSteps):
    """A module that saves its hyperparameters (the TensorBoard logger then logs ``hp_metric``)."""

    def __init__(self, some_val: int = 7, **options: Any):
        super().__init__(**options)
        self.save_hyperparameters()


def step_logs_in_hooks(pl: Any) -> Any:
    """A `StepLogsInHooks` callback of package ``pl``."""
    return type("StepLogsInHooksCallback", (StepLogsInHooks, pl.Callback), {"__module__": __name__})()


LoadersStep = type("LoadersStep", (LoadersStepSteps, ours.LightningModule), {"__module__": __name__})
StepLogsInHooksCallback = type("StepLogsInHooksCallback", (StepLogsInHooks, ours.Callback), {"__module__": __name__})
