"""The mirror's ModelCheckpoint on 2 ranks writes each Lightning checkpoint file as Lightning does: one
``torch.save`` on rank 0 per file and none on rank 1, the callback's ``state_dict()`` once per save on
every rank; the file holds every rank's random generators, and a 2-rank run resumed from it trains as
the uninterrupted 2-rank run (random draws in training_step included). One process:
tests/unit/callbacks/test_lightning_checkpoint_writes.py."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.multiprocess.api.test_lightning_checkpoint_files_ranks import Regression, fit
from trainer.lightning.callbacks import ModelCheckpoint

pytestmark = pytest.mark.timeout(600)

DDP = dict(strategy="ddp", devices=2, accelerator="cpu")


class CountingCheckpoint(ModelCheckpoint):
    """Counts ``state_dict()`` and ``torch.save`` calls from the start of training; each rank writes its
    counts to ``<record>/rank-<r>.json`` at the end."""

    def __init__(self, record: str, **settings):
        super().__init__(**settings)
        self.record, self.state_dict_calls, self.saves = record, 0, []

    def on_train_start(self, trainer, pl_module):
        super().on_train_start(trainer, pl_module)
        real = torch.save

        def save(obj, f, *args, **kwargs):
            self.saves.append(os.path.basename(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else "<buffer>")
            return real(obj, f, *args, **kwargs)

        torch.save = save
        self._real_save = real

    def state_dict(self):
        self.state_dict_calls += 1
        return super().state_dict()

    def on_train_end(self, trainer, pl_module):
        super().on_train_end(trainer, pl_module)
        torch.save = self._real_save
        os.makedirs(self.record, exist_ok=True)
        with open(os.path.join(self.record, f"rank-{trainer.global_rank}.json"), "w") as handle:
            json.dump({"state_dict_calls": self.state_dict_calls, "saves": self.saves}, handle)


class Noisy(Regression):
    """Draws from each rank's generator in every step: a resume must restore each rank's own stream."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        noise = torch.randn_like(y) * 0.1
        return torch.nn.functional.mse_loss(self.layer(x), y + noise)


def test_rank_zero_writes_each_file_once_and_the_other_rank_nothing(tmp_path):
    record = str(tmp_path / "record")
    callback = CountingCheckpoint(record, dirpath=str(tmp_path / "ckpt"), monitor="val_loss", save_top_k=-1)
    fit(tmp_path / "run", Regression(batch_size=4), [callback], max_epochs=3, **DDP)
    names = [f"epoch={e}-step={2 * (e + 1)}.ckpt" for e in range(3)]
    assert sorted(os.listdir(tmp_path / "ckpt")) == names
    with open(os.path.join(record, "rank-0.json")) as handle:
        zero = json.load(handle)
    with open(os.path.join(record, "rank-1.json")) as handle:
        one = json.load(handle)
    assert [name.rsplit(".tmp-", 1)[0] for name in zero["saves"]] == [f".{name}" for name in names]
    assert one["saves"] == []
    assert zero["state_dict_calls"] == one["state_dict_calls"] == 3


@pytest.mark.parametrize("mid_epoch", [False, True])
def test_a_resume_from_the_file_restores_every_ranks_generators(tmp_path, mid_epoch):
    """From ``last.ckpt`` of an epoch's end, or from a file ``every_n_train_steps`` saved in
    ``on_train_batch_end`` inside an epoch (step 3 of 2 an epoch)."""
    torch.manual_seed(0)
    whole = Noisy(batch_size=4)
    fit(tmp_path / "whole", whole, [], max_epochs=4, **DDP)
    if mid_epoch:
        saving = ModelCheckpoint(dirpath=str(tmp_path / "half"), every_n_train_steps=3, save_top_k=-1, filename="{step}")
        fit(tmp_path / "a", Noisy(batch_size=4), [saving], max_epochs=4, **DDP)
        path = str(tmp_path / "half" / "step=3.ckpt")
    else:
        saving = ModelCheckpoint(dirpath=str(tmp_path / "half"), save_last=True)
        fit(tmp_path / "a", Noisy(batch_size=4), [saving], max_epochs=2, **DDP)
        path = str(tmp_path / "half" / "last.ckpt")
    saved = torch.load(path, weights_only=True)["meshtrainer"]["objects"]
    generators = [saved[f"rng/rank-{rank:05d}.pt"]["torch"] for rank in (0, 1)]
    assert not torch.equal(*generators)  # each rank's own stream is in the file
    resumed = Noisy(batch_size=4)
    fit(tmp_path / "b", resumed, [], max_epochs=4, ckpt_path=path, **DDP)
    torch.testing.assert_close(resumed.layer.weight, whole.layer.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(resumed.layer.bias, whole.layer.bias, rtol=1e-6, atol=1e-7)
