"""A damaged checkpoint is named, never loaded: the commit marker records every file's size.

Sharded (every rank writes its own data file) and full format, sync and async saves. Under
``trainer.resume=auto`` a damaged latest checkpoint is skipped for the newest intact one; an
explicit ``trainer.resume`` naming a damaged one, or no intact one at all, is an error naming the
file. A checkpoint committed before sizes were recorded loads unchecked.
"""

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.support.helpers import REPO, CheckpointedRegressor, fit, read_metrics
from trainer.checkpoint import CheckpointError, layout

pytestmark = pytest.mark.timeout(240)


def save(run_dir, steps=4, strategy="single", devices=1, **checkpoint):
    options = dict(every_n_steps=2, keep_last=None)
    options.update(checkpoint)
    args = dict(strategy=strategy, devices=devices)
    fit(run_dir, CheckpointedRegressor(dropout=0.0), batch_size=16 // args["devices"], max_steps=steps,
        checkpoint=options, **args)
    return layout.committed_checkpoints(str(run_dir / "checkpoints"))


def truncate(file):
    with open(file, "r+b") as handle:
        handle.truncate(os.path.getsize(file) // 2)


def recorded_files(path):
    return layout.read_marker(path)["files"]


def resume(run_dir, resume, steps=6, **kwargs):
    fit(run_dir, CheckpointedRegressor(dropout=0.0), batch_size=16, max_steps=steps, resume=resume,
        checkpoint=dict(save_last=False), **kwargs)
    return [r["step"] for r in read_metrics(str(run_dir)) if "train/loss" in r]


def assert_sizes_recorded(path, expected_data_files):
    files = recorded_files(path)
    on_disk = {os.path.relpath(os.path.join(folder, name), path): os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(path) for name in names if name != layout.COMMITTED}
    assert files == on_disk
    assert set(expected_data_files) <= set(files), sorted(files)


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_marker_records_every_file_size_one_process(tmp_path, fmt, async_save):
    checkpoints = save(tmp_path / "run", format=fmt, async_save=async_save)
    data = ["model_optim/__0_0.distcp", "model_optim/.metadata"] if fmt == "sharded" else ["model_optim.pt"]
    for path in checkpoints:
        assert_sizes_recorded(path, data + ["rng/rank-00000.pt", "trainer_state.json", "extras.pt"])


@pytest.fixture(scope="module")
def two_rank_sharded(tmp_path_factory):
    """2-rank DDP, sharded, checkpoints at steps 2 and 4 (sync), and an async twin."""
    root = tmp_path_factory.mktemp("integrity")
    sync = save(root / "sync", strategy="ddp", devices=2)
    async_ = save(root / "async", strategy="ddp", devices=2, async_save=True)
    return sync, async_


def test_marker_records_every_rank_file(two_rank_sharded):
    for path in two_rank_sharded[0] + two_rank_sharded[1]:
        assert_sizes_recorded(path, ["model_optim/__0_0.distcp", "model_optim/__1_0.distcp", "model_optim/.metadata",
                                     "rng/rank-00000.pt", "rng/rank-00001.pt", "trainer_state.json", "extras.pt"])


@pytest.mark.parametrize("damaged", ["model_optim/__1_0.distcp", "rng/rank-00001.pt", "extras.pt"])
def test_explicit_resume_of_a_damaged_checkpoint_names_the_file(tmp_path, two_rank_sharded, damaged):
    import shutil

    copy = tmp_path / "step"
    shutil.copytree(two_rank_sharded[0][-1], copy)
    truncate(copy / damaged)
    with pytest.raises(CheckpointError) as error:
        resume(tmp_path / "again", str(copy))
    message = str(error.value)
    assert "\n" not in message
    assert str(copy / damaged) in message and "truncated" in message, message


def test_missing_file_is_named(tmp_path):
    latest = save(tmp_path / "run", steps=2)[-1]
    os.remove(os.path.join(latest, "model_optim", "__0_0.distcp"))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp is missing"):
        resume(tmp_path / "again", latest)


def test_auto_resume_skips_a_damaged_latest_checkpoint(tmp_path, two_rank_sharded, caplog):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(os.path.dirname(two_rank_sharded[1][0]), run_dir / "checkpoints")  # the async saves
    damaged = run_dir / "checkpoints" / layout.checkpoint_name(4) / "model_optim" / "__0_0.distcp"
    truncate(damaged)
    with caplog.at_level(logging.WARNING):
        steps = resume(run_dir, "auto")
    assert steps == [3, 4, 5, 6]  # from step 2, the newest intact one
    assert any("skipping damaged checkpoint" in r.getMessage() and str(damaged) in r.getMessage()
               for r in caplog.records), caplog.text


def test_auto_resume_with_no_intact_checkpoint_is_an_error(tmp_path):
    checkpoints = save(tmp_path / "run", format="full")
    for path in checkpoints:
        truncate(os.path.join(path, "model_optim.pt"))
    with pytest.raises(CheckpointError, match=r"trainer.resume=auto: no intact checkpoint in .*model_optim\.pt has"):
        resume(tmp_path / "run", "auto")


def test_checkpoint_saved_before_sizes_were_recorded_still_loads(tmp_path):
    latest = save(tmp_path / "run", steps=2)[-1]
    marker = layout.read_marker(latest)
    del marker["files"]
    layout.write_atomic(os.path.join(latest, layout.COMMITTED), json.dumps(marker))
    assert resume(tmp_path / "again", latest, steps=4) == [3, 4]


@pytest.mark.parametrize("processes", [1, 2])
def test_damaged_checkpoint_under_train_py_is_one_line(tmp_path, processes):
    # 2: the trainer's own launcher spawns the workers; each stops with the same error.
    run_dir = tmp_path / "run"
    common = [sys.executable, "train.py", "recipe=mlp", "trainer.log_every_n_steps=1", "trainer.progress_bar=false",
              "trainer.val_every_n_steps=null", f"hydra.run.dir={run_dir}"]
    if processes == 2:
        common += ["strategy=ddp", "trainer.devices=2"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    first = subprocess.run(common + ["trainer.max_steps=2"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    latest = layout.find_latest(str(run_dir / "checkpoints"))
    damaged = os.path.join(latest, "model_optim", f"__{processes - 1}_0.distcp")
    truncate(damaged)
    again = subprocess.run(common + ["trainer.max_steps=4", f"trainer.resume={latest}"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1, again.stderr[-3000:]
    assert "Traceback" not in again.stdout + again.stderr, again.stdout[-3000:] + again.stderr[-3000:]
    errors = [line for line in again.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: checkpoint {latest} is damaged: {damaged} has"), \
        again.stderr
    assert "rank 0 failed: checkpoint" in (run_dir / "train.log").read_text()  # the log says why the run ended


def test_consolidating_a_damaged_checkpoint_names_the_file(tmp_path):
    from trainer.checkpoint import consolidate

    latest = save(tmp_path / "run", steps=2)[-1]
    truncate(os.path.join(latest, "model_optim", "__0_0.distcp"))
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp has \d+ bytes, the commit recorded"):
        consolidate(latest, str(tmp_path / "weights.pt"))
