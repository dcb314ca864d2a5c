"""``self.log`` names and hooks: a name the user logs is the user's (the trainer's own value under that
name is not written, one value per key and step; the progress bar still shows the returned loss as
"loss"); callbacks and module hooks log where Lightning's table allows, with its defaults, and the
hooks it refuses are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.support.helpers import Regressor, read_metrics, run_trainer
from trainer.callbacks import Callback
from trainer.observe.progress import ProgressBar

pytestmark = pytest.mark.timeout(300)


class LogsTrainerNames(Regressor):
    """Logs train/loss (twice the returned loss, to tell them apart) and val/loss (the validation MAE)."""

    def __init__(self):
        super().__init__(num_samples=64, val_samples=32)
        self.returned = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.returned.append(loss.item())
        self.log("train/loss", 2 * loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        self.log("val/loss", (prediction - y).abs().mean())
        return F.mse_loss(prediction, y)


def test_a_name_the_user_logs_is_the_users(tmp_path):
    module = LogsTrainerNames()
    run_trainer(tmp_path, module, batch_size=16, max_steps=4, val_every_n_steps=4)
    records = read_metrics(str(tmp_path))
    steps = [r for r in records if "train/lr" in r]
    assert [r["train/loss"] for r in steps] == pytest.approx([2 * v for v in module.returned], rel=1e-6)
    by_step = {}
    for record in records:  # one value per key and step
        for key in record:
            if key not in ("step", "epoch"):
                assert (record["step"], key) not in by_step, (record["step"], key)
                by_step[record["step"], key] = record[key]
    validation = [r for r in records if "val/loss" in r]
    assert len(validation) == 1
    x, y = module.val_dataset().tensors
    assert validation[0]["val/loss"] == pytest.approx((module(x) - y).abs().mean().item(), rel=1e-5)  # the MAE


def test_the_bar_shows_the_returned_loss_where_the_user_logs_train_loss():
    bar = ProgressBar(10, enabled=True)
    try:
        bar.also_show = {"train/loss"}
        bar.own_values = {"train/loss": 0.25}
        bar.update({"train/loss": 0.5, "train/lr": 0.1})
        assert bar._postfix["loss"] == "0.2500" and bar._postfix["train/loss"] == "0.5"
    finally:
        bar.close()


class HookLogger(Callback):
    def on_train_epoch_start(self, trainer, module):
        module.log("cb/epoch_start", 1.0)  # an epoch value (the default there)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        module.log("cb/batch_start", float(batch_idx))  # a step value (the default there)

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        module.log("cb/val_batch", float(len(batch[0])), reduce_fx="sum")  # an epoch value: the samples

    def on_validation_epoch_end(self, trainer, module):
        module.log("cb/val_epoch", 3.0)


class ModuleHooks(Regressor):
    def __init__(self):
        super().__init__(num_samples=64, val_samples=20)

    def on_train_epoch_start(self):
        self.log("m/epoch_start", 5.0)

    def on_before_optimizer_step(self, optimizer):
        self.log("m/before_step", 7.0)


def test_callbacks_and_module_hooks_log_with_lightnings_defaults(tmp_path):
    run_trainer(tmp_path, ModuleHooks(), batch_size=16, max_steps=-1, max_epochs=1, callbacks=[HookLogger()],
                check_val_every_n_epoch=1)
    records = read_metrics(str(tmp_path))
    steps = [r for r in records if "train/lr" in r]
    assert [r["cb/batch_start"] for r in steps] == [0.0, 1.0, 2.0, 3.0]
    assert [r["m/before_step"] for r in steps] == [7.0] * 4
    epoch = [r for r in records if "cb/epoch_start" in r]
    assert len(epoch) == 1 and epoch[0]["m/epoch_start"] == 5.0 and epoch[0]["cb/epoch_start"] == 1.0
    validation = [r for r in records if "cb/val_epoch" in r]
    assert len(validation) == 1 and validation[0]["cb/val_batch"] == 20.0 and validation[0]["cb/val_epoch"] == 3.0


class LogsIn(Regressor):
    def __init__(self, hook, **log_args):
        super().__init__(num_samples=32, val_samples=16)
        self.hook, self.log_args = hook, log_args

    def _maybe(self, hook):
        if hook == self.hook:
            self.log("m", 1.0, **self.log_args)

    def on_train_epoch_end(self):
        self._maybe("on_train_epoch_end")

    def on_fit_end(self):
        self._maybe("on_fit_end")
        super().on_fit_end()


@pytest.mark.parametrize("hook, args, match", [
    ("on_train_epoch_end", dict(on_step=True), r"on_train_epoch_end logs with on_step in \[False\]"),
    ("on_fit_end", {}, r"called from on_fit_end\(\) where values cannot be logged"),
])
def test_lightnings_refusals(tmp_path, hook, args, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        run_trainer(tmp_path, LogsIn(hook, **args), batch_size=16, max_steps=-1, max_epochs=1)


class LogsAtEpochEnd(Callback):
    def on_train_epoch_end(self, trainer, module):
        module.log("cb/epoch_end", 1.0)


class WatcherLogsAtEpochEnd(LogsAtEpochEnd):
    watches_metrics = True  # runs after the module's on_train_epoch_end and the epoch's reduction


def test_a_callbacks_epoch_end_value_belongs_to_its_epoch(tmp_path):
    # As Lightning: a callback's on_train_epoch_end runs before the module's and before the epoch's values
    # are reduced, so what it logs is that epoch's.
    run_trainer(tmp_path, Regressor(num_samples=32), batch_size=16, max_steps=-1, max_epochs=2,
                callbacks=[LogsAtEpochEnd()])
    rows = [r for r in read_metrics(str(tmp_path)) if "cb/epoch_end" in r]
    assert [(r["epoch"], r["cb/epoch_end"]) for r in rows] == [(0, 1.0), (1, 1.0)]


def test_a_metric_watchers_epoch_end_value_is_not_given_to_the_next_epoch(tmp_path):
    # A metric watcher's on_train_epoch_end runs after the epoch's values are reduced: logging there is
    # refused rather than counted in the next epoch.
    with pytest.raises(RuntimeError, match=r"self.log\('cb/epoch_end'\) in on_train_epoch_end\(\) after this training"):
        run_trainer(tmp_path, Regressor(num_samples=32), batch_size=16, max_steps=-1, max_epochs=2,
                    callbacks=[WatcherLogsAtEpochEnd()])


class EpochLossAtEpochEnd(Regressor):
    """Logs train/loss only from on_train_epoch_end (the mean of its steps' losses)."""

    def __init__(self):
        super().__init__(num_samples=32)
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(loss.detach())
        return loss

    def on_train_epoch_end(self):
        self.log("train/loss", torch.stack(self.losses).mean())
        self.losses.clear()


def test_a_trainer_name_first_logged_at_an_epoch_end_is_said_then_the_users(tmp_path, caplog):
    # Epoch 0's last step wrote the trainer's train/loss before on_train_epoch_end logged the user's: said
    # once; from then on only the user's value is written under that name.
    run_trainer(tmp_path, EpochLossAtEpochEnd(), batch_size=16, max_steps=-1, max_epochs=2)
    assert "first logged at this epoch end, were also written by the trainer" in caplog.text
    records = read_metrics(str(tmp_path))
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 2, 4]


class CountsByHand(Regressor):
    """Updates a SumMetric in validation_step and logs its compute() itself at the epoch end (not logged
    as an object: nothing resets it but the user's own reset)."""

    def __init__(self):
        super().__init__(num_samples=32, val_samples=20)
        from torchmetrics import SumMetric

        self.count = SumMetric()

    def validation_step(self, batch, batch_idx):
        self.count(torch.ones(len(batch[0])))
        return super().validation_step(batch, batch_idx)

    def on_validation_epoch_end(self):
        self.log("val/count", self.count.compute())
        self.count.reset()


def test_the_sanity_pass_leaves_metric_objects_as_they_were(tmp_path):
    run_trainer(tmp_path, CountsByHand(), batch_size=8, max_steps=-1, max_epochs=2, check_val_every_n_epoch=1,
                num_sanity_val_steps=2)
    assert [r["val/count"] for r in read_metrics(str(tmp_path)) if "val/count" in r] == [20.0, 20.0]
