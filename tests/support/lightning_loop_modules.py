"""Modules for the Lightning loop-semantics tests, written once for Lightning and for ``trainer.lightning``:
each ``*Steps`` class holds the hooks; ``build(pl, Steps)`` makes the LightningModule of package ``pl``
(Lightning's ``lightning.pytorch`` as the oracle, or ``trainer.lightning``). The classes for our side are
also defined at module level, so spawned ranks can import them."""

from __future__ import annotations

import json
import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as ours


def build(pl: Any, steps: type) -> type:
    base = pl.LightningModule if issubclass(steps, ModuleSteps) else pl.LightningDataModule
    return type(steps.__name__.replace("Steps", ""), (steps, base), {"__module__": __name__})


def run_call(pl: Any, module: Any, call: str = "fit", root: str = ".", datamodule: Any = None, **flags: Any) -> Any:
    """``call`` on a Trainer of ``pl`` with quiet defaults (no logger, checkpoint, bar or summary)."""
    settings = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=root, log_every_n_steps=1, num_sanity_val_steps=0)
    settings.update(flags)
    trainer = pl.Trainer(**settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = getattr(trainer, call)(module, datamodule=datamodule)
    return trainer, result


class ModuleSteps:
    """A linear regression on 16 samples (``x = [2i, 2i + 1] / 10``), batches of ``batch_size``
    unshuffled; records the hook calls in ``self.calls``."""

    def __init__(self, batch_size: int = 4, **options: Any):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)
        self.batch_size, self.options, self.calls = batch_size, options, []

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.calls.append(("training_step", self.current_epoch, batch_idx))
        self.log("l", loss, on_step=True, on_epoch=True)
        return loss

    def on_train_epoch_end(self):
        self.calls.append(("on_train_epoch_end", self.current_epoch, self.global_step))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step == self.options.get("stop_at_step"):  # (a stop asked for in the middle of an epoch)
            self.trainer.should_stop = True

    def on_train_end(self):
        self.calls.append(("on_train_end", self.current_epoch, self.global_step))

    def on_validation_epoch_end(self):
        self.calls.append(("on_validation_epoch_end", self.current_epoch, self.global_step))

    def validation_step(self, batch, batch_idx):
        self.log("v", self.layer(batch[0]).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.arange(32.0).view(16, 2) / 10), batch_size=self.batch_size)

    def val_dataloader(self):  # 5 samples: global batches of 2, the last one short
        return DataLoader(TensorDataset(torch.arange(10.0).view(5, 2) / 10), batch_size=self.options.get("eval_batch", 2))

    test_dataloader = val_dataloader


class SkipSteps(ModuleSteps):
    """``on_train_batch_start`` returns -1 in epoch 0 on the batch holding sample ``options["skip_sample"]``
    (on 2 ranks only one rank holds it)."""

    def on_train_batch_start(self, batch, batch_idx):
        self.calls.append(("on_train_batch_start", self.current_epoch, batch_idx))
        value = self.options["skip_sample"] * 2 / 10
        if self.current_epoch == 0 and bool(torch.isclose(batch[0][:, 0], torch.tensor(value)).any()):
            return -1
        return None


class ManualSkipSteps(SkipSteps):
    """`SkipSteps` under manual optimization."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.layer(batch[0]).pow(2).mean()
        self.calls.append(("training_step", self.current_epoch, batch_idx))
        self.log("l", loss, on_step=True, on_epoch=True)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


class EvalStepSteps(ModuleSteps):
    """``self.log(..., on_step=True)`` in validation and test steps (with and without on_epoch)."""

    def validation_step(self, batch, batch_idx):
        output = self.layer(batch[0])  # a mean, and a sum reduced by sum: the global batch's on any world size
        self.log("vs", output.mean(), on_step=True, on_epoch=True)
        self.log("vo", output.sum(), on_step=True, on_epoch=False, reduce_fx="sum")

    def test_step(self, batch, batch_idx):
        self.log("ts", self.layer(batch[0]).mean(), on_step=True)


class RecordingSteps:
    """A logger's hooks that append each ``log_metrics`` row to a JSON-lines file (readable after
    spawned ranks ended)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    name, version = "recording", 0

    @property
    def experiment(self) -> None:
        return None

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")


def recording_logger(pl: Any, path: str) -> Any:
    return type("Recording", (RecordingSteps, pl.loggers.Logger), {"__module__": __name__})(path)


def recorded_rows(path: str, names: tuple[str, ...]) -> list[dict[str, float]]:
    """The rows of ``path`` that hold one of ``names``, with only those names and the step."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k in names or k == "step"} for row in rows if any(n in row for n in names)]


class SeveralLoadersSteps(ModuleSteps):
    """Two test / predict loaders (a list, or a dict with ``options["as_dict"]``) of 5 and 3 samples."""

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.calls.append(("test_step", batch_idx, dataloader_idx))
        self.log("t", self.layer(batch[0]).mean())

    def on_test_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.calls.append(("on_test_batch_end", batch_idx, dataloader_idx))

    def on_test_epoch_end(self):
        self.calls.append(("on_test_epoch_end",))
        self.log("e", 1.0)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.calls.append(("predict_step", batch_idx, dataloader_idx))
        return self.layer(batch[0])

    def _loaders(self):
        size = self.options.get("eval_batch", 2)
        first = DataLoader(TensorDataset(torch.arange(10.0).view(5, 2) / 10), batch_size=size)
        second = DataLoader(TensorDataset(torch.arange(6.0).view(3, 2) + 1), batch_size=size)
        return {"first": first, "second": second} if self.options.get("as_dict") else [first, second]

    test_dataloader = predict_dataloader = _loaders


class EpochEndAgainSteps(ModuleSteps):
    """``shared`` logged per step in training_step, then per epoch in on_train_epoch_end (Lightning keeps both)."""

    def training_step(self, batch, batch_idx):
        self.log("shared", 100.0, prog_bar=True, logger=False)
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        self.log_dict({"shared": 111.0, f"at_{self.current_epoch}": float(self.current_epoch)}, prog_bar=True)


class AddIndexOrNotSteps(SeveralLoadersSteps):
    """Per-loader names with and without ``add_dataloader_idx``."""

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("common", 7.0)
        self.log(f"only_{dataloader_idx}", 3.0 * (dataloader_idx + 1), add_dataloader_idx=False)
        self.log_dict({"a" if dataloader_idx == 0 else "b": 1.0}, add_dataloader_idx=False)


Skip = build(ours, SkipSteps)
SeveralLoaders = build(ours, SeveralLoadersSteps)
Module = build(ours, ModuleSteps)
EvalStep = build(ours, EvalStepSteps)
EpochEndAgain = build(ours, EpochEndAgainSteps)
AddIndexOrNot = build(ours, AddIndexOrNotSteps)
Recording = type("Recording", (RecordingSteps, ours.loggers.Logger), {"__module__": __name__})


def run_both(pl: Any, build_steps: Any, root: Any, steps: type, module_args: dict | None = None, call: str = "fit",
             **flags: Any) -> list[tuple[Any, Any, Any]]:
    """``[(module, trainer, result)]`` of ``call`` under Lightning (``pl``), then under ``trainer.lightning``:
    the module ``build_steps(package, steps)`` builds, run with the same ``flags`` in ``root/<side>``."""
    runs = []
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build_steps(package, steps)(**(module_args or {}))
        trainer, result = run_call(package, module, call, str(root / side), **flags)
        runs.append((module, trainer, result))
    return runs


def callback_numbers(trainer: Any) -> dict[str, float]:
    """``trainer.callback_metrics`` as Python numbers."""
    return {name: float(value) for name, value in trainer.callback_metrics.items()}
