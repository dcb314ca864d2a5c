"""The mirror's Trainer reads the CUDA device count through its public
``trainer.lightning.accelerators.cuda.num_cuda_devices`` each time one is built: a program or test that
patches it builds the Trainer Lightning builds under the same patch of Lightning's; unpatched on a machine
without CUDA, ``accelerator="gpu"`` is refused at construction. The compatibility harness makes the
fixtures of Lightning's tests that mock the count patch the mirror's function too."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from trainer.lightning import pytorch as mirror
from trainer.lightning.accelerators import cuda

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))), "bench")


def lightning_trainer_devices(monkeypatch, count: int, **flags) -> int:
    pl = pytest.importorskip("lightning.pytorch")
    fabric_cuda = importlib.import_module("lightning.fabric.accelerators.cuda")
    pytorch_cuda = importlib.import_module("lightning.pytorch.accelerators.cuda")
    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: count)
    monkeypatch.setattr(pytorch_cuda, "num_cuda_devices", lambda: count)
    return pl.Trainer(logger=False, enable_checkpointing=False, **flags).num_devices


@pytest.mark.parametrize("flags", [dict(accelerator="gpu", devices=1), dict(devices=2), dict(accelerator="cuda", devices="auto")])
def test_a_patched_count_builds_the_trainer_lightning_builds(tmp_path, monkeypatch, flags):
    expected = lightning_trainer_devices(monkeypatch, 2, **flags)
    monkeypatch.setattr(cuda, "num_cuda_devices", lambda: 2)
    assert cuda.is_cuda_available()
    trainer = mirror.Trainer(logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path), **flags)
    assert trainer.num_devices == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_without_a_patch_gpu_is_refused_at_construction(monkeypatch):
    assert cuda.num_cuda_devices() == 0 and not cuda.is_cuda_available()
    with pytest.raises(ValueError, match=r"accelerator='cuda' but torch.cuda.is_available\(\) is False"):
        mirror.Trainer(accelerator="gpu", devices=1)
    from trainer import Trainer
    from trainer.strategies.ddp import DDPStrategy

    monkeypatch.setattr(cuda, "num_cuda_devices", lambda: 2)  # the mirror's reading, not the core Trainer's
    with pytest.raises(ValueError, match=r"accelerator='cuda' but torch.cuda.is_available\(\) is False"):
        Trainer(accelerator="cuda")
    with pytest.raises(ValueError, match=r"accelerator='cuda' but torch.cuda.is_available\(\) is False"):
        Trainer(strategy=DDPStrategy(accelerator="cuda"), devices=2)


def test_lightnings_accelerator_classes_say_what_to_use():
    with pytest.raises(ImportError, match=r"lightning.pytorch.accelerators.CUDAAccelerator .*accelerator='cpu'"):
        from trainer.lightning.accelerators import CUDAAccelerator  # noqa: F401


def test_the_harness_patches_the_mirrors_count_where_lightnings_fixture_patches_lightnings(monkeypatch):
    sys.path.insert(0, BENCH)
    try:
        from _lightning_compat_rewrite import mirror_fixture_patches
        from _lightning_compat_shim import mirror_setattr
    finally:
        sys.path.remove(BENCH)
    fixture = ("def mock_cuda_count(monkeypatch, n):\n"
               "    monkeypatch.setattr(lightning.pytorch.accelerators.cuda, \"num_cuda_devices\", lambda: n)\n"
               "    monkeypatch.setattr(lightning.pytorch.strategies.xla, \"_XLA_AVAILABLE\", n > 0)\n\n")
    rewritten = mirror_fixture_patches(fixture)
    assert rewritten.count("_ltc_mirror_setattr(monkeypatch, 'trainer.lightning.accelerators.cuda', "
                           "\"num_cuda_devices\", lambda: n)") == 1
    assert rewritten.endswith("n > 0)\n\n")  # the blank lines after it kept
    mirror_setattr(monkeypatch, "trainer.lightning.accelerators.cuda", "num_cuda_devices", lambda: 3)
    mirror_setattr(monkeypatch, "trainer.lightning.strategies.xla", "_XLA_AVAILABLE", True)  # none there: nothing
    assert cuda.num_cuda_devices() == 3
