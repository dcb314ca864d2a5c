"""Two ranks against one process on the same global batch: several validation loaders give each
loader's metric as one process does, and ``reload_dataloaders_every_n_epochs`` trains the same (the
hooks read the same data on every rank, under the trainer's seed). Tolerances as in
test_equivalence.py (CPU fp32: the all-reduce sums in another order)."""

from __future__ import annotations

import pytest
import torch

from tests.support.reload_modules import ReloadingModule, SeveralValLoaders, reload_record, val_record
from tests.support.helpers import train_losses
from trainer.lightning import Trainer

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)


def fit(run_dir, module, devices: int, **kwargs) -> None:
    # one process x 8, or two ranks x 4: the same global batch of 8
    args = dict(run_dir=str(run_dir), loggers=["jsonl"], progress_bar=False, enable_model_summary=False,
                log_every_n_steps=1, num_sanity_val_steps=0, enable_checkpointing=False, devices=devices,
                strategy="ddp" if devices > 1 else "single", collective_timeout_s=120)
    args.update(kwargs)
    Trainer(**args).fit(module)


def test_several_validation_loaders_and_reloads_on_two_ranks_match_one_process(tmp_path):
    fit(tmp_path / "one", SeveralValLoaders(batch_sizes=(4, 3)), 1, max_epochs=2, batch_size=8)
    fit(tmp_path / "two", SeveralValLoaders(batch_sizes=(4, 3)), 2, max_epochs=2, batch_size=4)
    one, two = val_record(tmp_path / "one"), val_record(tmp_path / "two")
    assert sorted(one["metrics"]) == sorted(two["metrics"]) == ["val_mse/dataloader_idx_0", "val_mse/dataloader_idx_1"]
    for name, value in one["metrics"].items():
        assert two["metrics"][name] == pytest.approx(value, rel=1e-5)
    # each rank ran a share of each loader's batches (one entry per loader)
    assert len(two["num_val_batches"]) == 2 and 0 < two["num_val_batches"][0] < 3

    fit(tmp_path / "r1", ReloadingModule(batch_sizes=(8,)), 1, max_epochs=4, reload_dataloaders_every_n_epochs=2)
    fit(tmp_path / "r2", ReloadingModule(batch_sizes=(4,)), 2, max_epochs=4, reload_dataloaders_every_n_epochs=2)
    assert [e for hook, e, _ in reload_record(tmp_path / "r2")["calls"] if hook == "train"] == [0, 2]
    torch.testing.assert_close(torch.tensor(train_losses(str(tmp_path / "r2"))),
                               torch.tensor(train_losses(str(tmp_path / "r1"))), **TOL)
    one_params = torch.load(tmp_path / "r1" / "params_rank0.pt")
    for name, value in torch.load(tmp_path / "r2" / "params_rank0.pt").items():
        torch.testing.assert_close(value, one_params[name], **TOL)
