"""``training_step`` returning None under automatic optimization skips the batch as Lightning skips it
(one process), with Lightning itself as the oracle: the same weights, learning rates, ``global_step`` and
hook calls after a fit in which some batches return None, with and without gradient accumulation (a
skipped first / last micro-batch of a window, and a whole window skipped), momentum, weight decay and a
scheduler. The 2-rank error: tests/multiprocess/loop/test_skipped_batch_ranks.py."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as ours
from tests.support.helpers import read_metrics
from tests.support.lightning_loop_modules import run_both
from trainer import Trainer, TrainModule
from trainer.lightning.utilities.exceptions import MisconfigurationException
from trainer.loop.train_step import TrainStep

pl = pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.timeout(300)


class SkippingSteps:
    """A linear regression on 32 fixed samples in unshuffled batches of 4; ``training_step`` returns None
    on the batches of ``skip`` (indices in the epoch). No step hook: one-micro-batch quiet steps take the
    short way here (trainer/loop/train_step.py)."""

    def __init__(self, skip=()):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 2)
        self.skip, self.calls = set(skip), []

    def training_step(self, batch, batch_idx):
        self.calls.append(("training_step", self.current_epoch, batch_idx))
        if batch_idx in self.skip:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(32, 3, generator=generator), torch.randn(32, 2, generator=generator))
        return DataLoader(data, batch_size=4)


class HookedSkippingSteps(SkippingSteps):
    """`SkippingSteps` recording the backward and step hooks (every step then takes the whole way)."""

    def on_before_backward(self, loss):
        self.calls.append(("on_before_backward", self.global_step))

    def on_after_backward(self):
        self.calls.append(("on_after_backward", self.global_step))

    def on_before_optimizer_step(self, optimizer):
        self.calls.append(("on_before_optimizer_step", self.global_step))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.calls.append(("on_train_batch_end", batch_idx, sorted(outputs),
                           self.trainer.optimizers[0].param_groups[0]["lr"]))


def build(package, steps):
    return type(steps.__name__.replace("Steps", ""), (steps, package.LightningModule), {"__module__": __name__})


@pytest.mark.parametrize("steps", [SkippingSteps, HookedSkippingSteps])
@pytest.mark.parametrize("skip, accumulate", [
    ({0, 3, 6}, 1),  # the first step (the whole way: FLOPs not yet counted), then quiet steps
    ({0, 3, 4, 5}, 2),  # a window's first micro-batch, one's last, a whole window
    ({7}, 4),  # the epoch's last micro-batch
])
def test_skipped_batches_train_as_lightning(tmp_path, monkeypatch, steps, skip, accumulate):
    quiet = []
    original = TrainStep.quiet_step
    monkeypatch.setattr(TrainStep, "quiet_step", lambda self, *a: (quiet.append(1), original(self, *a))[1])
    (pl_module, pl_trainer, _), (module, trainer, _) = run_both(
        pl, build, tmp_path, steps, {"skip": skip}, max_epochs=2, accumulate_grad_batches=accumulate,
        log_every_n_steps=50)
    assert module.calls == pl_module.calls  # no backward hooks for a skipped batch; outputs {} for it
    assert trainer.global_step == pl_trainer.global_step == 16 // accumulate  # a skipped step counts
    # (one micro-batch a step and no hook: all but the first step and the logging ones take the short way)
    assert len(quiet) >= 12 if steps is SkippingSteps and accumulate == 1 else not quiet
    lr = trainer.optimizers[0].param_groups[0]["lr"]  # the schedule steps on skipped steps too
    assert lr == pytest.approx(pl_trainer.optimizers[0].param_groups[0]["lr"], rel=1e-6)
    assert lr == pytest.approx(0.1 * 0.8 ** (16 // accumulate), rel=1e-6)
    for (name, mine), theirs in zip(module.state_dict().items(), pl_module.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    initial = build(ours, steps)()  # (the weights did train)
    assert not torch.allclose(initial.layer.weight, module.layer.weight)


def test_a_skipped_batch_is_said_once_and_a_dict_without_loss_is_lightnings_error(tmp_path):
    module = build(ours, SkippingSteps)(skip={1, 2})
    with pytest.warns(UserWarning, match=r"training_step returned None at batch_idx 1: the batch is skipped") as seen:
        ours.Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False).fit(module)
    assert sum("returned None" in str(w.message) for w in seen) == 1

    class NoLoss(build(ours, SkippingSteps)):
        def training_step(self, batch, batch_idx):
            return {"other": torch.tensor(1.0)}

    with pytest.raises(MisconfigurationException, match=r"training_step returned a dict without 'loss' at batch_idx 0"):
        ours.Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False).fit(NoLoss())


class Regression(TrainModule):
    """The trainer's own module: 16 samples, None on ``skip``; SGD without momentum."""

    def __init__(self, skip=()):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.skip = torch.nn.Linear(3, 1), set(skip)

    def train_dataset(self):
        generator = torch.Generator().manual_seed(2)
        return TensorDataset(torch.randn(16, 3, generator=generator), torch.randn(16, 1, generator=generator))

    def training_step(self, batch, batch_idx):
        if batch_idx in self.skip:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_skipped_batch_leaves_the_weights_where_they_were_and_logs_no_loss(tmp_path):
    # Batches of 4 (4 steps), batch 2 skipped: the weights after step 3 equal those after step 2, and
    # the weights after the run equal a run on the other batches with the skipped one's step taken alone.
    seen = []

    class Recording(Regression):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append([p.detach().clone() for p in self.parameters()])

    run = Trainer(max_steps=4, batch_size=4, log_every_n_steps=1, loggers=["jsonl"], progress_bar=False,
                  run_dir=str(tmp_path), checkpoint=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(Recording(skip={2}))
    assert len(seen) == 4 and run.global_step == 4
    assert all(torch.equal(a, b) for a, b in zip(seen[1], seen[2]))
    assert not all(torch.equal(a, b) for a, b in zip(seen[0], seen[1]))
    rows = [r for r in read_metrics(tmp_path) if "train/lr" in r]
    assert [("train/loss" in r) for r in rows] == [True, True, False, True]


def _fp16_weights(tmp_path, skip):
    module = build(ours, SkippingSteps)(skip=skip)
    trainer = ours.Trainer(default_root_dir=tmp_path, max_epochs=1, precision="16-mixed", accumulate_grad_batches=2,
                           logger=False, enable_checkpointing=False, enable_progress_bar=False,
                           enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return module.layer.weight.detach().clone(), trainer.global_step, trainer.optimizers[0].param_groups[0]["lr"]


def test_with_fp16_loss_scaling_a_skipped_last_micro_batch_skips_its_step_as_lightning(tmp_path):
    # Lightning's 16-mixed (GPU only there: on a CPU it trains bf16-mixed, so it is not run beside ours here)
    # takes no optimizer step and no loss-scale update where the closure's micro-batch (a step's last)
    # returned None, discarding the step's other gradients; the step and the schedule still count.
    last, steps, lr = _fp16_weights(tmp_path / "last", {1})
    window, window_steps, window_lr = _fp16_weights(tmp_path / "window", {0, 1})
    first, _, _ = _fp16_weights(tmp_path / "first", {0})
    assert torch.equal(last, window) and steps == window_steps == 4 and lr == window_lr
    assert not torch.equal(first, window)  # a skipped first micro-batch: the step takes the last one's gradient
