"""A save's cost to the training ranks: its collectives (no barrier), and the commit and retention
done by rank 0 in a background thread while every rank trains on.

Before: per sync sharded save, 2 monitored barriers (staging folder made by rank 0;
everything written) + one object gather (the small files' sizes) + DCP's own; rank 0 fsynced every
file, committed and deleted old checkpoints while the other ranks waited at the next collective.
Now: one object gather (2 all_gathers: sizes, then payload) + DCP's own collectives, nothing else.

Ordering, not timing: a deletion blocked on an event shows that ``save`` returned, and the ranks met
at their next collective, before it was released.
"""

import errno
import json
import os
import socket
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainer.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager, RunStates, layout

pytestmark = pytest.mark.timeout(180)
BLOCKED_FOR_AT_MOST = 60  # seconds a faked slow deletion waits before giving up (a failure, not a hang)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(step, epoch=0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return RunStates(model=model, optimizer=optimizer, progress=lambda: {"step": step, "epoch": epoch, "epoch_step": step})


def _counts(recorder):
    return {kind: int(entry["count"]) for kind, entry in recorder.counts.items()}


def _worker(rank, port, root):
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint.state import get_training_state
    from trainer.runtime.comms_log import CollectiveRecorder

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    report = {}
    try:
        # 1. The collectives of one save, and those of DCP's own save of the same state.
        for fmt in ("sharded", "full"):
            folder = os.path.join(root, fmt)
            manager = CheckpointManager(CheckpointConfig(dir=folder, format=fmt, save_on_signal=False), folder)
            manager.setup()
            with CollectiveRecorder() as recorder:
                manager.save(_run(step=1))
            report[f"{fmt}_save"] = _counts(recorder)
            manager.close(clean=True)
            run = _run(step=1)
            with CollectiveRecorder() as recorder:
                state = get_training_state(run.model, run.optimizer, fmt == "full")
                if fmt == "sharded":
                    dcp.save(state, checkpoint_id=os.path.join(root, "dcp-alone"))
            report[f"{fmt}_state_and_dcp"] = _counts(recorder)

        # 2. A slow deletion of the old checkpoint (keep_last=1) does not hold up any rank.
        folder = os.path.join(root, "retention")
        manager = CheckpointManager(CheckpointConfig(dir=folder, keep_last=1, save_on_signal=False), folder)
        manager.setup()
        manager.save(_run(step=1))
        manager.finish()
        old = os.path.join(folder, layout.checkpoint_name(1))
        entered, release, real_rmtree = threading.Event(), threading.Event(), layout.shutil.rmtree
        seen = {}

        def slow_rmtree(path, *args, **kwargs):
            if os.path.abspath(path) == old:
                seen["thread"] = threading.current_thread().name
                entered.set()
                seen["released"] = release.wait(BLOCKED_FOR_AT_MOST)
            return real_rmtree(path, *args, **kwargs)

        layout.shutil.rmtree = slow_rmtree
        try:
            manager.save(_run(step=2))
            # Read before the collective below: after it rank 0 may release the deletion while a
            # slow rank 1 has not looked yet.
            report["old_still_there_after_save"] = os.path.isdir(old)
            # The next collective training would make: both ranks get here while rank 0's
            # deletion is still blocked (it is released only below, by this thread).
            dist.all_gather_object([None, None], "step 3")
            if rank == 0:
                report["deletion_started"] = entered.wait(BLOCKED_FOR_AT_MOST)
                release.set()
            manager.finish()  # rank 0: the commit and its retention are done
        finally:
            layout.shutil.rmtree = real_rmtree
            release.set()
        report.update(seen)
        dist.barrier()  # rank 1 looks after rank 0's finish
        report["old_exists_after_finish"] = os.path.isdir(old)
        report["latest"] = os.path.basename(layout.find_latest(folder) or "")
        manager.close(clean=True)
        dist.barrier()
    finally:
        with open(os.path.join(root, f"report{rank}.json"), "w") as handle:
            json.dump(report, handle)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("commit")
    torch.multiprocessing.start_processes(_worker, args=(_free_port(), str(root)), nprocs=2,
                                        start_method="forkserver")  # forked from the session's warm server (conftest.py)
    return [json.loads((root / f"report{r}.json").read_text()) for r in range(2)]


def test_a_save_makes_one_gather_beyond_dcp_and_no_barrier(reports):
    for rank, report in enumerate(reports):
        print(f"rank {rank}: sharded save {report['sharded_save']} (DCP alone {report['sharded_state_and_dcp']}); "
              f"full save {report['full_save']}")
        for fmt in ("sharded", "full"):
            save, alone = report[f"{fmt}_save"], dict(report[f"{fmt}_state_and_dcp"])
            assert "barrier" not in save, (rank, fmt, save)
            # What the save adds to getting the state and writing it: one object gather (2 all_gathers).
            alone["all_gather"] = alone.get("all_gather", 0) + 2
            assert save == alone, (rank, fmt, save, alone)


def test_ranks_do_not_wait_for_retention(reports):
    for rank, report in enumerate(reports):
        assert report["old_still_there_after_save"], (rank, report)  # save returned before the deletion
        assert not report["old_exists_after_finish"] and report["latest"] == layout.checkpoint_name(2), (rank, report)
    zero = reports[0]
    assert zero["deletion_started"] and zero["released"], zero  # released by the test, not by the time-out
    assert zero["thread"].startswith("checkpoint-commit"), zero
    assert "thread" not in reports[1]  # only rank 0 deletes


# ----- one process -------------------------------------------------------------------------------------------
def _manager(root, **options):
    manager = CheckpointManager(CheckpointConfig(dir=str(root), save_on_signal=False, **options), str(root))
    manager.setup()
    return manager


def test_a_failed_commit_is_raised_and_the_previous_checkpoint_stays_latest(tmp_path, monkeypatch, caplog):
    manager = _manager(tmp_path)
    manager.save(_run(step=1))
    manager.finish()

    def failing(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(layout, "commit", failing)
    manager.save(_run(step=2))  # the commit fails in the background ...
    with pytest.raises(CheckpointError, match=r"committing the checkpoint .*step-000000002 .*failed "
                                              r"\(OSError: \[Errno 28\] No space left on device; [\d.]+ [MG]iB free "):
        manager.finish()  # ... and is raised on the training thread at the next wait
    assert layout.find_latest(str(tmp_path)).endswith(layout.checkpoint_name(1))
    assert not [name for name in os.listdir(tmp_path) if name.startswith(layout.STAGING_PREFIX)]
    manager.save(_run(step=3))  # after an error elsewhere, close still waits for the commit and logs its error
    manager.close(clean=False)
    assert "No space left on device" in caplog.text


def test_readers_wait_for_a_commit_in_flight(tmp_path, monkeypatch):
    manager = _manager(tmp_path)
    release, real_commit = threading.Event(), layout.commit

    def slow_commit(*args, **kwargs):
        release.wait(BLOCKED_FOR_AT_MOST)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(layout, "commit", slow_commit)
    manager.save(_run(step=1))
    threading.Timer(0.1, release.set).start()  # unblocks the commit; find_latest must wait for it
    assert layout.find_latest(str(tmp_path)).endswith(layout.checkpoint_name(1))
    assert release.is_set()
    manager.close(clean=True)


def test_the_same_step_saved_twice_keeps_the_second(tmp_path):
    # An epoch-end save right after a periodic save of the same step: the first may still be
    # committing, so the second is staged apart and committed after it.
    manager = _manager(tmp_path)
    manager.save(_run(step=3, epoch=0))
    manager.save(_run(step=3, epoch=1))
    manager.close(clean=True)
    final = tmp_path / layout.checkpoint_name(3)
    assert json.loads((final / "trainer_state.json").read_text())["epoch"] == 1
    assert layout.find_latest(str(tmp_path)) == str(final)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(layout.STAGING_PREFIX)]
