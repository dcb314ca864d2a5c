"""One program, traced under Lightning and under this trainer: every hook call of the module, its
DataModule and a callback, recorded in order into one list (the oracle test:
tests/unit/api/test_lightning_hook_order.py).

The program is written once against a namespace of base classes (Lightning's or ours), so both runs
execute the same code; only the import differs.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

#: where the data hooks run differs by design (this trainer reads them at set-up, to plan the global
#: batch before the model is wrapped); they are left out of the comparison
DATA_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")
#: module methods traced besides the hooks
STEPS = ("training_step", "validation_step", "test_step", "predict_step", "configure_optimizers",
         "configure_model", "configure_callbacks", "prepare_data")
#: hooks that exist in one of the two only (ours: the step-end hook with the step's metrics)
OURS_ONLY = ("on_train_step_end",)
SAMPLES, BATCH = 8, 4


def _data(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(SAMPLES, 2, generator=generator), torch.randn(SAMPLES, 1, generator=generator))


def _traced(cls: type, base: type, calls: list, who: str, names: list[str]) -> type:
    """A subclass of ``cls`` whose every hook in ``names`` records ``(who, name)`` and then runs."""
    namespace = {}
    for name in names:
        def hook(self, *args, __name=name, **kwargs):
            calls.append((who, __name))
            return getattr(super(traced, self), __name)(*args, **kwargs)
        namespace[name] = hook
    traced = type(f"Traced{cls.__name__}", (cls,), namespace)
    return traced


def hook_names(base: type) -> list[str]:
    """The hooks of ``base`` (a module, datamodule or callback class) worth tracing."""
    names = [n for n in dir(base) if (n.startswith("on_") or n in ("setup", "teardown", "state_dict", "load_state_dict",
             "backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step",
             "transfer_batch_to_device") or n in STEPS or n in DATA_HOOKS) and callable(getattr(base, n))]
    return [n for n in names if n not in OURS_ONLY and n not in ("on_exception",)]


def program(api: types.SimpleNamespace, calls: list, *, datamodule: bool = False, manual: bool = False) -> tuple[Any, Any, Any]:
    """(module, datamodule or None, callback) of the traced program, built on ``api``'s classes
    (``api.Module``, ``api.DataModule``, ``api.Callback``); ``manual``: manual optimization."""

    class Module(api.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.automatic_optimization = not manual

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("v", torch.nn.functional.mse_loss(self(x), y))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("t", torch.nn.functional.mse_loss(self(x), y))

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(api.DataModule):
        def train_dataloader(self):
            return DataLoader(_data(0), batch_size=BATCH)

        def val_dataloader(self):
            return DataLoader(_data(1), batch_size=BATCH)

        def test_dataloader(self):
            return DataLoader(_data(2), batch_size=BATCH)

        def predict_dataloader(self):
            return DataLoader(_data(3), batch_size=BATCH)

    if not datamodule:
        for name in DATA_HOOKS:
            setattr(Module, name, getattr(Data, name))
    # (the module's state_dict / load_state_dict are torch's, called as each checkpoint format needs)
    module_names = [n for n in hook_names(api.Module) if n not in ("state_dict", "load_state_dict")]
    module_cls = _traced(Module, api.Module, calls, "module", module_names)
    callback_cls = _traced(api.Callback, api.Callback, calls, "callback", hook_names(api.Callback))
    data = None
    if datamodule:
        names = [n for n in hook_names(api.DataModule) if n in ("setup", "teardown", "prepare_data", "state_dict",
                 "load_state_dict", "on_before_batch_transfer", "on_after_batch_transfer", "transfer_batch_to_device")]
        data = _traced(Data, api.DataModule, calls, "datamodule", names)()
    return module_cls(), data, callback_cls()


def comparable(calls: list, leave_out: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The calls without the data hooks (see DATA_HOOKS) and ``leave_out``."""
    return [call for call in calls if call[1] not in DATA_HOOKS and call[1] not in leave_out]
