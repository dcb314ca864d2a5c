"""A disk that fills during a save: the save fails with one line naming the checkpoint and the free
space, its staging folder is removed, and the previous checkpoint stays ``latest`` and loads.

The full disk is an ENOSPC raised at the write of one of the checkpoint's files."""

import errno
import json
import os
import re
import socket
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import torch.distributed.checkpoint.filesystem as dcp_filesystem
from trainer.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager, RunStates, layout

pytestmark = pytest.mark.timeout(120)


def _run(step, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return RunStates(model=model, optimizer=optimizer, progress=lambda: {"step": step, "epoch": 0, "epoch_step": step})


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fail_torch_save_of(name, monkeypatch):
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if str(path).endswith(name):
            _full_disk()
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def _fail_dcp_data(monkeypatch):
    real_create_stream = dcp_filesystem.FileSystem.create_stream

    def create_stream(self, path, mode):
        if "w" in mode and str(path).endswith(".distcp"):
            _full_disk()
        return real_create_stream(self, path, mode)

    monkeypatch.setattr(dcp_filesystem.FileSystem, "create_stream", create_stream)


@pytest.mark.parametrize("fmt, async_save, failing", [
    ("full", False, "model_optim.pt"),
    ("full", True, "model_optim.pt"),
    ("sharded", False, "model_optim"),
    ("sharded", False, "extras.pt"),
])
def test_a_full_disk_keeps_the_previous_checkpoint_latest(tmp_path, monkeypatch, fmt, async_save, failing):
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), format=fmt, async_save=async_save,
                                                 save_on_signal=False), str(tmp_path))
    manager.setup()
    saved = _run(step=1, seed=0)
    manager.save(saved)
    manager.finish()
    previous = layout.find_latest(str(tmp_path))

    with monkeypatch.context() as patch:
        if failing == "model_optim" and fmt == "sharded":
            _fail_dcp_data(patch)
        else:
            _fail_torch_save_of(failing, patch)
        with pytest.raises(CheckpointError) as raised:
            manager.save(_run(step=2, seed=1))
            manager.finish()  # an async write's error is raised at the next wait
    message = str(raised.value)
    assert "\n" not in message
    assert layout.staging_path(str(tmp_path), 2) in message
    assert "no space left on device" in message.lower()
    assert re.search(r"\d+\.\d [MG]iB free of \d+\.\d [MG]iB on " + re.escape(str(tmp_path)), message)  # the space left
    manager.close(clean=False)

    # Nothing of the failed save is left, and the previous checkpoint is `latest` and loads.
    assert layout.find_latest(str(tmp_path)) == previous
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(previous), layout.LATEST])
    resumed = _run(step=0, seed=2)
    progress = CheckpointManager(CheckpointConfig(dir=str(tmp_path), save_on_signal=False), str(tmp_path)).load(
        previous, resumed)
    assert progress["step"] == 1
    for mine, theirs in zip(resumed.model.parameters(), saved.model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_rank_worker(rank, port, root):
    import pytest as worker_pytest

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    report = {}
    try:
        # Rank 1's disk fills: at its own small file (before the gather), then at its DCP data file.
        # Then rank 0's disk, at the full format's one file (which rank 1 does not write).
        for case, fmt, failing_rank, fail in (
            ("small_file", "sharded", 1, lambda patch: _fail_torch_save_of("rank-00001.pt", patch)),
            ("dcp_data", "sharded", 1, _fail_dcp_data),
            ("full_file", "full", 0, lambda patch: _fail_torch_save_of("model_optim.pt", patch)),
        ):
            folder = os.path.join(root, case)
            manager = CheckpointManager(CheckpointConfig(dir=folder, format=fmt, save_on_signal=False), folder)
            manager.setup()
            manager.save(_run(step=1, seed=0))
            manager.finish()
            with worker_pytest.MonkeyPatch.context() as patch:
                if rank == failing_rank:
                    fail(patch)
                started = time.monotonic()
                try:
                    manager.save(_run(step=2, seed=1))
                    manager.finish()
                    report[case] = None
                except CheckpointError as error:
                    report[case] = str(error)
                report[f"{case}_seconds"] = time.monotonic() - started
            manager.close(clean=False)
            dist.barrier()  # rank 1 looks once rank 0 cleaned up
            report[f"{case}_left"] = sorted(os.listdir(folder))
            dist.barrier()
    finally:
        with open(os.path.join(root, f"report{rank}.json"), "w") as handle:
            json.dump(report, handle)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk_full")
    torch.multiprocessing.start_processes(_two_rank_worker, args=(_free_port(), str(root)), nprocs=2,
                                          start_method="forkserver")  # from the session's warm server (conftest.py)
    return [json.loads((root / f"report{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", ["small_file", "dcp_data", "full_file"])
def test_one_rank_with_a_full_disk_stops_every_rank_at_once(two_rank_reports, case):
    for report in two_rank_reports:
        message = report[case]
        assert message is not None and "\n" not in message
        assert "no space left on device" in message
        assert ("rank 1: OSError" in message) == (case != "full_file")  # rank 0 is not named
        assert re.search(r"[MG]iB free of", message)
        assert report[f"{case}_seconds"] < 20  # no rank waits for a collective timeout
        assert report[f"{case}_left"] == [layout.LATEST, layout.checkpoint_name(1)]


def test_a_fit_whose_disk_fills_stops_with_one_line_and_resumes_from_the_previous_checkpoint(tmp_path, monkeypatch):
    from tests.support.helpers import CheckpointedRegressor, fit, read_metrics

    real_save, saves = torch.save, []

    def save(obj, path, *args, **kwargs):  # the disk fills during the second checkpoint
        if str(path).endswith("extras.pt"):
            saves.append(path)
            if len(saves) == 2:
                _full_disk()
        return real_save(obj, path, *args, **kwargs)

    run_dir = tmp_path / "run"
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointError) as raised:
        fit(run_dir, CheckpointedRegressor(dropout=0.0), batch_size=16, max_steps=6,
            checkpoint=dict(every_n_steps=2, keep_last=None))
    monkeypatch.undo()
    root = str(run_dir / "checkpoints")
    message = str(raised.value)
    assert "\n" not in message and layout.staging_path(root, 4) in message
    assert re.search(r"no space left on device \(\d+\.\d [MG]iB free of .* on " + re.escape(root), message)
    assert sorted(os.listdir(root)) == sorted([layout.checkpoint_name(2), layout.LATEST])

    saves.clear()
    monkeypatch.setattr(torch, "save", lambda obj, path, *a, **k: saves.append(path) or real_save(obj, path, *a, **k))
    _, resumed = fit(run_dir, CheckpointedRegressor(dropout=0.0), batch_size=16, max_steps=6, resume="auto",
                     checkpoint=dict(every_n_steps=2, keep_last=None))
    monkeypatch.undo()
    assert [os.path.basename(os.path.dirname(path)) for path in saves if str(path).endswith("extras.pt")] == [
        os.path.basename(layout.staging_path(root, 4)), os.path.basename(layout.staging_path(root, 6))]  # from step 2
    assert layout.find_latest(root).endswith(layout.checkpoint_name(6))
    assert [r["step"] for r in read_metrics(str(run_dir)) if "train/loss" in r][-4:] == [3, 4, 5, 6]
    _, uninterrupted = fit(tmp_path / "uninterrupted", CheckpointedRegressor(dropout=0.0), batch_size=16,
                           max_steps=6, checkpoint=dict(every_n_steps=2, keep_last=None))
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)  # bitwise resume
