"""Lightning's ``Trainer`` flags, each honoured: ``deterministic`` / ``benchmark`` on every rank
(and restored after the call), ``inference_mode`` in validation / test / predict,
``gradient_clip_algorithm="value"`` (equal to a hand clip, DDP 2 and FSDP 2 equal to one process),
``enable_progress_bar`` and ``accelerator``."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.support.helpers import Regressor, new_trainer, read_metrics
from trainer import Trainer


class FlagRecorder(Regressor):
    """Writes, per rank, the torch flags seen in training_step and the grad modes of the evaluation steps."""

    def __init__(self, out: str):
        super().__init__(num_samples=32, val_samples=8)
        self.out = out

    def _record(self, key):
        path = os.path.join(self.out, f"flags-{key}-{self.global_rank}.json")
        with open(path, "w") as f:
            json.dump({"deterministic": torch.are_deterministic_algorithms_enabled(),
                       "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                       "benchmark": torch.backends.cudnn.benchmark,
                       "inference": torch.is_inference_mode_enabled(), "grad": torch.is_grad_enabled()}, f)

    def training_step(self, batch, batch_idx):
        self._record("train")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._record("val")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self._record("test")
        return super().validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        self._record("predict")
        return self(batch[0])


def recorded(out, key, ranks):
    return [json.load(open(os.path.join(out, f"flags-{key}-{rank}.json"))) for rank in range(ranks)]


@pytest.mark.parametrize("strategy,devices,deterministic,benchmark", [
    ("single", 1, True, None), ("ddp", 2, "warn", True), ("fsdp", 2, None, None)])
def test_deterministic_benchmark_and_inference_mode_on_every_rank(tmp_path, strategy, devices, deterministic,
                                                                    benchmark):
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    out = str(tmp_path)
    trainer = new_trainer(tmp_path / "run", strategy=strategy, devices=devices, max_steps=2, val_every_n_steps=2,
                          batch_size=8 // devices, deterministic=deterministic, benchmark=benchmark)
    module = FlagRecorder(out)
    trainer.fit(module)
    trainer.test(module, DataLoader(TensorDataset(torch.randn(4, 6), torch.randn(4, 1)), batch_size=2), verbose=False)
    trainer.predict(module, DataLoader(TensorDataset(torch.randn(4, 6)), batch_size=2))
    for flags in recorded(out, "train", devices):
        assert flags["deterministic"] is bool(deterministic)
        assert flags["warn_only"] is (deterministic == "warn")
        assert flags["benchmark"] is (bool(benchmark) if benchmark is not None or deterministic else before[1])
        assert flags["grad"] and not flags["inference"]
    for key in ("val", "test", "predict"):
        for flags in recorded(out, key, devices):
            # Lightning's default inference_mode=True; FSDP's forward gathers parameters: no_grad there.
            assert flags["inference"] is (strategy != "fsdp") and not flags["grad"], (key, flags)
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before  # restored


def test_inference_mode_false_evaluates_under_no_grad(tmp_path):
    module = FlagRecorder(str(tmp_path))
    new_trainer(tmp_path / "run", max_steps=1, inference_mode=False).fit(module)
    (flags,) = recorded(str(tmp_path), "val", 1)
    assert not flags["inference"] and not flags["grad"]


class ClipRecorder(Regressor):
    """Plain SGD whose optimizer records the gradients it steps with (a step pre-hook)."""

    def __init__(self):
        super().__init__(num_samples=64, lr=0.2)
        self.stepped_with = []

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.2)
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.stepped_with.append(
            [p.grad.detach().clone() for p in self.parameters()]))
        return optimizer


def losses(trainer):
    return [r["train/loss"] for r in read_metrics(trainer.run_dir) if "train/loss" in r]


def test_value_clipping_clips_each_element_as_a_hand_clip_and_ddp_fsdp_equal_one_process(tmp_path):
    clip = 0.05
    plain = ClipRecorder()
    new_trainer(tmp_path / "plain", max_steps=1, batch_size=16).fit(plain)
    clipped = ClipRecorder()
    one = new_trainer(tmp_path / "one", max_steps=4, batch_size=16, gradient_clip_val=clip,
                      gradient_clip_algorithm="value")
    one.fit(clipped)
    unclipped = plain.stepped_with[0]
    assert any((g.abs() > clip).any() for g in unclipped)  # the clip changes something
    for got, raw in zip(clipped.stepped_with[0], unclipped):  # the same first step: a hand clip of its gradients
        torch.testing.assert_close(got, raw.clamp(-clip, clip), rtol=0, atol=0)
    assert all(g.abs().max() <= clip for step in clipped.stepped_with for g in step)
    for strategy in ("ddp", "fsdp"):
        other = new_trainer(tmp_path / strategy, strategy=strategy, devices=2, max_steps=4, batch_size=8,
                            gradient_clip_val=clip, gradient_clip_algorithm="value")
        other.fit(ClipRecorder())
        torch.testing.assert_close(losses(other), losses(one), rtol=1e-5, atol=1e-6, msg=strategy)


def test_progress_bar_accelerator_and_bad_values(tmp_path):
    assert Trainer(enable_progress_bar=False, run_dir=str(tmp_path)).progress_bar is False
    assert Trainer(enable_progress_bar=True, progress_bar=True, run_dir=str(tmp_path)).progress_bar is True
    with pytest.raises(ValueError, match=r"enable_progress_bar=False and trainer.progress_bar=True name the same"):
        Trainer(enable_progress_bar=False, progress_bar=True)
    assert Trainer(accelerator="cpu", run_dir=str(tmp_path)).strategy.accelerator == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"accelerator='cuda' but torch.cuda.is_available\(\) is False"):
            Trainer(accelerator="gpu")  # Lightning's "gpu" is cuda
    with pytest.raises(ValueError, match=r"trainer.accelerator='mps' is not supported: this trainer runs on 'cpu' or"):
        Trainer(accelerator="mps")
    with pytest.raises(ValueError, match=r"trainer.deterministic must be true, false, 'warn' or null, got 'yes'"):
        Trainer(deterministic="yes")
    with pytest.raises(ValueError, match=r"gradient_clip_algorithm='max': give 'norm'"):
        Trainer(gradient_clip_algorithm="max")
    with pytest.raises(ValueError, match=r"trainer.inference_mode must be true or false"):
        Trainer(inference_mode=None)
