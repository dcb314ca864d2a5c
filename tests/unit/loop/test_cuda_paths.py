"""Where a CUDA run takes another path than a CPU run: the model and every batch moved to the device,
batches read into pinned memory, host syncs that a CPU run does not make (a ``.item()`` on a CUDA
tensor waits for the device). Run where CUDA is available (``gpu`` mark); bench/gpu_check.sh runs them first."""

from __future__ import annotations

import pytest

from tests.support.helpers import HotPathProbe, Regressor, fit, read_hot_path, run_trainer
from tests.support.same_training import assert_same_training

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

STEPS = 8
# fp32 on both devices (TF32 off for matmuls by default): only the order of the sums differs
TOL = {"rtol": 1e-4, "atol": 1e-5}


class DeviceChecked(Regressor):
    """Records where its parameters and each batch are during the training step."""

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        assert inputs.device.type == targets.device.type == "cuda", (inputs.device, targets.device)
        assert all(p.device.type == "cuda" for p in self.parameters())
        return super().training_step(batch, batch_idx)


def test_a_cuda_run_with_pinned_memory_trains_as_the_cpu_run(tmp_path):
    cpu = fit(tmp_path / "cpu", accelerator="cpu", max_steps=STEPS, batch_size=16)
    cuda = fit(tmp_path / "cuda", DeviceChecked(), accelerator="cuda", max_steps=STEPS, batch_size=16, pin_memory=True)
    assert_same_training(cuda, cpu, steps=STEPS, tol=TOL)


def test_loader_workers_and_pinned_memory_on_cuda_give_the_same_training(tmp_path):
    plain = fit(tmp_path / "plain", accelerator="cuda", max_steps=STEPS, batch_size=16)
    workers = fit(tmp_path / "workers", DeviceChecked(), accelerator="cuda", max_steps=STEPS, batch_size=16,
                  pin_memory=True, num_workers=2)
    assert_same_training(workers, plain, steps=STEPS, tol={"rtol": 0, "atol": 0})


def test_a_quiet_cuda_step_makes_no_host_sync(tmp_path):
    every = 4
    run_trainer(tmp_path, Regressor(), accelerator="cuda", max_steps=3 * every, batch_size=16, log_every_n_steps=every,
                checkpoint=None, callbacks=[HotPathProbe()])
    windows = read_hot_path(str(tmp_path), 1)[0]
    quiet = {step: w for step, w in windows.items() if step > 1 and step % every and (step - 1) % every}
    assert quiet, windows
    assert {step: w["syncs"] for step, w in quiet.items()} == {step: 0 for step in quiet}, \
        {step: w["where"] for step, w in quiet.items()}
