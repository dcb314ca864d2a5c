"""Several validation loaders (a list or dict from ``val_dataloader()``, or given to ``fit`` /
``validate``): each loader's metric is the exact mean over its own set (``/dataloader_idx_N``), the
steps and batch hooks get ``dataloader_idx``, limits and batch counts are per loader. The 2-rank
equivalence is in tests/multiprocess/data/test_data_reload.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.support.reload_modules import SeveralValLoaders, val_record
from trainer.lightning import Trainer

pytestmark = pytest.mark.timeout(300)


def lightning_trainer(run_dir, **kwargs) -> Trainer:
    args = dict(run_dir=str(run_dir), loggers=["jsonl"], progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, max_epochs=1, enable_checkpointing=False)
    args.update(kwargs)
    return Trainer(**args)


def exact_means(module: SeveralValLoaders, limits=(None, None)) -> list[float]:
    """Each loader's mean squared error over its samples (the first ``limit`` batches), by hand."""
    means = []
    for data, batch_size, limit in zip(module.val_sets(), module.batch_sizes, limits):
        x, y = data.tensors
        n = len(x) if limit is None else min(len(x), limit * batch_size)
        with torch.no_grad():
            means.append(F.mse_loss(module.net(x[:n]), y[:n]).item())
    return means


@pytest.mark.parametrize("as_dict", [False, True])
def test_each_loader_has_its_exact_mean_and_its_dataloader_idx(tmp_path, as_dict):
    module = SeveralValLoaders(as_dict=as_dict)
    lightning_trainer(tmp_path).fit(module)
    record = val_record(tmp_path)
    means = exact_means(module)
    assert sorted(record["metrics"]) == ["val_mse/dataloader_idx_0", "val_mse/dataloader_idx_1"]
    for idx, mean in enumerate(means):
        assert record["metrics"][f"val_mse/dataloader_idx_{idx}"] == pytest.approx(mean, rel=1e-5)
    expected = [(0, b, n) for b, n in enumerate([4, 4, 2])] + [(1, b, n) for b, n in enumerate([3, 3, 1])]
    assert [tuple(s) for s in record["steps"]] == expected
    assert [tuple(h) for h in record["hooks"]] == [(i, b) for i, b, _ in expected]
    assert record["num_val_batches"] == [3, 3]


def test_limit_val_batches_counts_global_batches_per_loader(tmp_path):
    module = SeveralValLoaders()
    lightning_trainer(tmp_path, limit_val_batches=2).fit(module)
    record = val_record(tmp_path)
    for idx, mean in enumerate(exact_means(module, limits=(2, 2))):
        assert record["metrics"][f"val_mse/dataloader_idx_{idx}"] == pytest.approx(mean, rel=1e-5)
    assert record["num_val_batches"] == [2, 2]


def test_loaders_given_to_fit_and_validate_and_the_trainers_attributes(tmp_path):
    module = SeveralValLoaders()
    loaders = [DataLoader(s, batch_size=b) for s, b in zip(module.val_sets(), module.batch_sizes)]
    trainer = lightning_trainer(tmp_path)
    trainer.fit(module, val_dataloaders=loaders)
    assert trainer.val_dataloaders is loaders and trainer.enable_validation
    results = trainer.validate(module, dataloaders=loaders)
    means = exact_means(module)
    assert [sorted(r) for r in results] == [["val_mse/dataloader_idx_0"], ["val_mse/dataloader_idx_1"]]
    for idx, mean in enumerate(means):
        assert results[idx][f"val_mse/dataloader_idx_{idx}"] == pytest.approx(mean, rel=1e-5)


def test_an_empty_list_is_refused(tmp_path):
    module = SeveralValLoaders()
    module.val_dataloader = lambda: []
    with pytest.raises(ValueError, match=r"val_dataloader\(\) returned no DataLoader \(an empty list\)"):
        lightning_trainer(tmp_path).fit(module)
