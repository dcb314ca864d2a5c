"""``reload_dataloaders_every_n_epochs`` (Lightning's Trainer): the data hooks run again every N epochs,
each epoch trains on the samples of its period's read, and the new loaders keep the run's batch
settings and epoch length or are refused; a run resumed inside a period trains as the uninterrupted one
(the period's read is drawn again under the same seed). The 2-rank check is in
tests/multiprocess/data/test_data_reload.py."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import read_metrics, train_losses
from tests.support.reload_modules import ReloadingModule, reload_record
from trainer.api.errors import MisconfigurationException
from trainer.lightning import Trainer

pytestmark = pytest.mark.timeout(300)


def lightning_trainer(run_dir, **kwargs) -> Trainer:
    args = dict(run_dir=str(run_dir), loggers=["jsonl"], progress_bar=False, log_every_n_steps=1,
                enable_model_summary=False, num_sanity_val_steps=0, check_val_every_n_epoch=1)
    args.update(kwargs)
    return Trainer(**args)


def test_hooks_run_again_every_n_epochs_and_each_epoch_trains_on_its_periods_data(tmp_path):
    module = ReloadingModule()
    lightning_trainer(tmp_path, max_epochs=5, reload_dataloaders_every_n_epochs=2, num_sanity_val_steps=1).fit(module)
    record = reload_record(tmp_path)
    train_epochs = [epoch for hook, epoch, _ in record["calls"] if hook == "train"]
    val_calls = [(epoch, sanity) for hook, epoch, sanity in record["calls"] if hook == "val"]
    assert train_epochs == [0, 2, 4]
    # read first for the sanity pass (which counts for epoch 0's validation), then every 2 epochs
    assert val_calls == [(0, True), (2, False), (4, False)]
    assert record["calls"][0][0] == "val"  # (Lightning's order: the sanity pass's loader first)
    steps_per_epoch = 32 // 8
    tags = [tag for step in record["tags"] for tag in step]
    assert tags == [e - e % 2 for e in range(5) for _ in range(steps_per_epoch)]


def test_without_reload_the_hooks_run_once(tmp_path):
    module = ReloadingModule()
    lightning_trainer(tmp_path, max_epochs=3).fit(module)
    assert [hook for hook, _, _ in reload_record(tmp_path)["calls"]] == ["train", "val"]


@pytest.mark.parametrize("value", [-1, "test", 1.5])
def test_a_bad_value_is_refused_as_lightning(value):
    with pytest.raises(MisconfigurationException, match="reload_dataloaders_every_n_epochs=.*should be an int >= 0"):
        Trainer(reload_dataloaders_every_n_epochs=value)


def test_a_reloaded_loader_with_another_batch_size_is_refused(tmp_path):
    module = ReloadingModule(batch_sizes=(8, 4))
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs: .*train_dataloader\(\) at epoch 1 returns "
                                         r"a DataLoader with batch_size=4, the run's is 8"):
        lightning_trainer(tmp_path, max_epochs=2, reload_dataloaders_every_n_epochs=1).fit(module)


def test_a_reloaded_loader_of_another_epoch_length_is_refused_unless_limited(tmp_path):
    module = ReloadingModule(train_sizes=(32, 48))
    with pytest.raises(ValueError, match="at epoch 1 makes 6 optimizer steps per epoch, the fit's first loader 4"):
        lightning_trainer(tmp_path / "a", max_epochs=2, reload_dataloaders_every_n_epochs=1).fit(module)
    module = ReloadingModule(train_sizes=(32, 48))  # capped at 3 steps: both lengths give the same epoch
    lightning_trainer(tmp_path / "b", max_epochs=2, reload_dataloaders_every_n_epochs=1, limit_train_batches=3).fit(module)
    assert [tag for step in reload_record(tmp_path / "b")["tags"] for tag in step] == [0, 0, 0, 1, 1, 1]


def test_resume_inside_a_reload_period_trains_as_the_uninterrupted_run(tmp_path):
    whole = ReloadingModule()
    lightning_trainer(tmp_path / "whole", max_epochs=5, reload_dataloaders_every_n_epochs=2).fit(whole)
    first = ReloadingModule()
    lightning_trainer(tmp_path / "first", max_epochs=5, max_steps=14, reload_dataloaders_every_n_epochs=2,
                      checkpoint=dict(every_n_steps=14, format="full")).fit(first)
    resumed = ReloadingModule()  # resumed at epoch 3's third step, inside the period read at epoch 2
    lightning_trainer(tmp_path / "resumed", max_epochs=5, reload_dataloaders_every_n_epochs=2,
                      resume=str(tmp_path / "first" / "checkpoints")).fit(resumed)
    assert [e for hook, e, _ in reload_record(tmp_path / "resumed")["calls"] if hook == "train"][-2:] == [3, 4]
    # (the hook saw the resumed epoch, 3, but drew the period's data again: the same steps follow)
    losses = {r["step"]: r["train/loss"] for r in read_metrics(str(tmp_path / "resumed")) if "train/loss" in r}
    assert sorted(losses) == list(range(15, 21))
    assert [losses[s] for s in range(15, 21)] == train_losses(str(tmp_path / "whole"))[14:]
    for name, value in torch.load(tmp_path / "whole" / "params_rank0.pt").items():
        torch.testing.assert_close(torch.load(tmp_path / "resumed" / "params_rank0.pt")[name], value, rtol=1e-6,
                                   atol=1e-7)
