"""``Trainer.test`` and ``Trainer.predict``: exact test metrics on any world size, every sample
predicted once and in order on 1, 2 and 4 ranks (spawned workers), FSDP's lockstep forward, the
pipeline's refusal, ``module=None`` reusing the fitted module, ``ckpt_path=`` and the docs' example."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from tests.support.helpers import REPO, BlockRegressor, Regressor, new_trainer

NUM_SAMPLES = 37  # not a multiple of the batch (4) nor of the ranks (2, 4): short last batch, uneven shards
TOL = dict(rtol=1e-5, atol=1e-6)


class Indexed(Dataset):
    """Sample i: (its index, 6 features drawn from a generator seeded with i)."""

    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, i):
        return torch.tensor(i), torch.randn(6, generator=torch.Generator().manual_seed(i))


def labelled_data():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(NUM_SAMPLES, 6, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(NUM_SAMPLES, 1, generator=generator))


class Evaluated(Regressor):
    """A Regressor with test data, a test_step and a predict loader (batch 4, dataset order)."""

    def test_dataset(self):
        return labelled_data()

    def test_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        return {"loss": F.mse_loss(prediction, y), "abs_error": (prediction - y).abs().mean()}

    def predict_dataloader(self):
        return DataLoader(Indexed(), batch_size=4)

    def predict_step(self, batch, batch_idx):
        index, x = batch
        return {"index": index, "batch_idx": torch.full_like(index, batch_idx), "y": self(x).squeeze(1)}


class ShardedEvaluated(BlockRegressor):
    """The same under FSDP (blocks built in configure_model are the sharding units)."""

    test_dataset, test_step = Evaluated.test_dataset, Evaluated.test_step

    def predict_dataloader(self):
        return DataLoader(Indexed(), batch_size=3)  # 13 batches over 2 ranks: rank 1 runs a lockstep filler

    predict_step = Evaluated.predict_step


def trainer(tmp_path, name, **args):
    return new_trainer(tmp_path / name, **{"max_steps": 4, **args})


def check_predictions(outputs, batch_size):
    """Every sample once, in order, in batches of ``batch_size`` (the last one short)."""
    assert [len(out["index"]) for out in outputs] == [min(batch_size, NUM_SAMPLES - b * batch_size)
                                                        for b in range(len(outputs))]
    assert torch.cat([out["index"] for out in outputs]).tolist() == list(range(NUM_SAMPLES))
    for b, out in enumerate(outputs):
        assert (out["batch_idx"] == b).all()
    return torch.cat([out["y"] for out in outputs])


def test_test_metrics_equal_on_one_process_and_two_ddp_ranks(tmp_path):
    single = trainer(tmp_path, "single", batch_size=8)
    single.fit(Evaluated())
    expected = single.test()  # module=None: the module of the last fit
    ddp = trainer(tmp_path, "ddp", strategy="ddp", devices=2, batch_size=4)
    ddp.fit(Evaluated())
    got = ddp.test()
    assert set(expected) == {"test/loss", "test/abs_error"} == set(got)
    for name in expected:  # exact means over the 37 samples (batch 8 vs 2 x 4, uneven shards)
        assert got[name] == pytest.approx(expected[name], rel=1e-5), name
    assert ddp.logged_metrics["test/loss"] == got["test/loss"]


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_predict_returns_each_sample_once_in_order(tmp_path, devices):
    reference = check_predictions(trainer(tmp_path, "one").predict(Evaluated()), 4)
    if devices == 1:
        return
    # Spawned workers: the outputs come back to this process through the result file.
    outputs = trainer(tmp_path, f"ddp{devices}", strategy="ddp", devices=devices).predict(Evaluated())
    torch.testing.assert_close(check_predictions(outputs, 4), reference, **TOL)


def test_predict_and_test_under_fsdp_two_ranks(tmp_path):
    reference = check_predictions(trainer(tmp_path, "one").predict(ShardedEvaluated()), 3)
    outputs = trainer(tmp_path, "fsdp", strategy="fsdp", devices=2, batch_size=4).predict(ShardedEvaluated())
    torch.testing.assert_close(check_predictions(outputs, 3), reference, **TOL)
    # test_dataset() batched by data.batch_size 3: 13 batches, so rank 1 runs a zero-weight filler forward.
    expected = trainer(tmp_path, "one", batch_size=3).test(ShardedEvaluated())
    got = trainer(tmp_path, "fsdp", strategy="fsdp", devices=2, batch_size=3).test(ShardedEvaluated())
    assert got == pytest.approx(expected, rel=1e-5)


def test_pipeline_refuses_test_and_predict(tmp_path):
    pipeline = trainer(tmp_path, "pipe", strategy="pipeline", devices=2)
    for call in (pipeline.test, pipeline.predict):
        with pytest.raises(ValueError, match=r"not supported with strategy=pipeline.*strategy=single, ddp or fsdp"):
            call(ShardedEvaluated())


def test_names_that_cannot_work_are_errors(tmp_path):
    plain = trainer(tmp_path, "plain")
    with pytest.raises(ValueError, match=r"does not override test_step"):
        plain.test(Regressor())
    with pytest.raises(ValueError, match=r"has not fitted one to reuse; call trainer.predict\(module\)"):
        plain.predict()

    class NoTestData(Regressor):
        test_step = Evaluated.test_step

    with pytest.raises(ValueError, match=r"NoTestData has no test data; define test_dataset\(\) or test_dataloader\(\)"):
        plain.test(NoTestData())

    class ShuffledPredict(Evaluated):
        def predict_dataloader(self):
            return DataLoader(Indexed(), batch_size=4, shuffle=True)

    with pytest.raises(ValueError, match=r"predict_dataloader\(\): shuffle=True cannot be honoured"):
        plain.predict(ShuffledPredict())


def test_ckpt_path_on_test_and_predict(tmp_path):
    fitted = trainer(tmp_path, "fit", checkpoint=dict(save_last=True, format="full"))
    module = Evaluated()
    fitted.fit(module)
    expected_metrics, expected_outputs = fitted.test(), fitted.predict()
    assert fitted.global_step == 4  # test / predict keep the fitted progress
    # A fresh module (initial weights) and trainer: the checkpoint's weights are what is evaluated.
    again = trainer(tmp_path, "fit", checkpoint=dict(save_last=True, format="full"))
    assert again.test(Evaluated(), ckpt_path="last") == pytest.approx(expected_metrics, rel=1e-6)
    assert again.global_step == 4  # the checkpoint's step
    untrained = trainer(tmp_path, "fresh").test(Evaluated())
    assert untrained["test/loss"] != pytest.approx(expected_metrics["test/loss"], rel=1e-3)  # the check can fail
    outputs = again.predict(Evaluated(), ckpt_path="last")
    torch.testing.assert_close(check_predictions(outputs, 4), check_predictions(expected_outputs, 4), **TOL)


def test_docs_test_predict_example_runs(tmp_path):
    with open(os.path.join(REPO, "docs", "guide", "module.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (tmp_path / "example.py").write_text(next(block for block in blocks if "class Clusters(DataModule)" in block))
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'test/accuracy'" in done.stdout and "torch.Size([37])" in done.stdout, done.stdout
