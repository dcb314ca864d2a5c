"""Each logger brought back to a checkpoint on resume (trainer/loggers/resume_history.py), read back
in its own format: metrics.jsonl and metrics.csv as files, TensorBoard through its EventAccumulator,
W&B through its ``.wandb`` files (a reader of the tests' own, tests/unit/loggers/test_loggers.py).
The whole loop with kill -9 is tests/multiprocess/loggers/test_dashboards_after_kill.py."""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest

from tests.unit.loggers.test_loggers import no_network_wandb  # noqa: F401 (autouse: W&B offline, for each test here)
from tests.unit.loggers.test_loggers import offline_runs, read_csv, tensorboard_scalars, wandb_records, wandb_run
from trainer.loggers import CSVLogger, JSONLLogger, TensorBoardLogger, WandbLogger
from trainer.loggers.resume_history import resume_loggers
from trainer.loggers.wandb_history import history_steps
from trainer.loggers.wandb_run_id import adopt_run_id

pytestmark = pytest.mark.timeout(120)


def loss(step: int, attempt: int = 0) -> float:
    return 1.0 / step + attempt  # a resumed attempt's values differ: what a dashboard shows is visible


def history(steps) -> list:
    return [(step, {"train/loss": loss(step)}) for step in steps]


def test_jsonl_is_cut_back_to_the_lines_written_before_the_save(tmp_path):
    logger = JSONLLogger(str(tmp_path))
    for step in range(1, 7):
        logger.log_metrics({"train/loss": loss(step)}, step)
    logger.log_metrics({"val/loss": 0.5}, 6)
    saved = logger.lines_written()  # what a checkpoint at step 6 records
    logger.log_metrics({"epoch/loss": 0.4}, 6)  # logged at step 6 after the save
    for step in (7, 8):
        logger.log_metrics({"train/loss": loss(step)}, step)
    with open(logger.path, "a") as f:
        f.write('{"step": 9, "train/lo')  # a line cut short by the kill
    assert saved == 7

    resumed = JSONLLogger(str(tmp_path))
    kept, dropped_from = resumed.cut_to_checkpoint(6, saved)
    lines = [json.loads(line) for line in open(resumed.path)]
    assert lines == [{"step": s, "train/loss": loss(s)} for s in range(1, 7)] + [{"step": 6, "val/loss": 0.5}]
    assert kept == [(s, {"train/loss": loss(s)}) for s in range(1, 7)] + [(6, {"val/loss": 0.5})]
    assert dropped_from == 6
    assert resumed.lines_written() == 7
    resumed.log_metrics({"epoch/loss": 0.4}, 6)
    assert resumed.lines_written() == 8 and json.loads(open(resumed.path).readlines()[-1]) == {"step": 6, "epoch/loss": 0.4}
    # A checkpoint without the count: the lines up to its step are kept.
    assert JSONLLogger(str(tmp_path)).cut_to_checkpoint(5, None)[1] == 6
    assert [json.loads(line)["step"] for line in open(resumed.path)] == [1, 2, 3, 4, 5]


def test_csv_drops_rows_after_the_checkpoint_and_refills_its_row(tmp_path):
    logger = CSVLogger.in_run_dir(str(tmp_path))
    for step in range(1, 9):
        logger.log_metrics({"train/loss": loss(step)}, step)
        if step == 6:
            logger.log_metrics({"val/loss": 0.5}, 6)  # after the save at step 6
    logger.finalize()

    resumed = CSVLogger.in_run_dir(str(tmp_path))
    resumed.resume_at(6, history(range(1, 7)), dropped_from=6)
    resumed.log_metrics({"val/loss": 0.25}, 6)  # logged again after the resume: the same row
    for step in (7, 8):
        resumed.log_metrics({"train/loss": loss(step, attempt=1)}, step)
    resumed.finalize()
    columns, rows = read_csv(tmp_path / "metrics.csv")
    assert columns == ["step", "train/loss", "val/loss"]
    assert [(int(r["step"]), float(r["train/loss"]), r["val/loss"]) for r in rows] == \
        [(s, loss(s), "") for s in range(1, 6)] + [(6, loss(6), "0.25"), (7, loss(7, 1), ""), (8, loss(8, 1), "")]
    # Without a jsonl logger, the CSV file is the history the other loggers are filled from.
    assert CSVLogger.in_run_dir(str(tmp_path)).rows_up_to(2) == [(1, {"train/loss": loss(1)}), (2, {"train/loss": loss(2)})]


@pytest.mark.parametrize("flushed", [8, 3], ids=["past-the-checkpoint", "short-of-it"])
def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path, flushed):
    first = TensorBoardLogger.in_run_dir(str(tmp_path))
    for step in range(1, flushed + 1):  # what the killed run's event file holds
        first.log_metrics({"train/loss": loss(step)}, step)
    first.finalize()

    resumed = TensorBoardLogger.in_run_dir(str(tmp_path))
    resumed.log_hyperparams({"lr": 0.1})  # (the writer opens before the resume, as in a run)
    resumed.resume_at(6, history(range(1, 7)), dropped_from=7)
    for step in range(7, 11):
        resumed.log_metrics({"train/loss": loss(step, attempt=1)}, step)
    resumed.finalize()
    # The killed run's file stays (TensorBoard hides its later steps); the resumed run writes its own
    # (two when its first was opened in the same second as the killed run's: see resume_at).
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) in (2, 3)
    expected = [(s, loss(s)) for s in range(1, 7)] + [(s, loss(s, 1)) for s in range(7, 11)]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in tensorboard_scalars(tmp_path)["train/loss"]] == expected


def wandb_steps(run_dir) -> list[tuple[int, float]]:
    """(step, train/loss) of every history row of every offline run folder, in the order started."""
    rows = []
    for folder in offline_runs(run_dir):
        (path,) = glob.glob(os.path.join(folder, "*.wandb"))
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                values = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                rows.append((record.history.step.num, values["train/loss"]))
    return rows


def finish(logger: WandbLogger) -> str:
    """``logger.finalize()``, once W&B's service has written the run's file; returns the file."""
    (path,) = glob.glob(os.path.join(os.path.dirname(logger.run.dir), "*.wandb"))
    logger.finalize()
    wandb_run(path)  # (waits for the run's record)
    return path


def finished_wandb_run(run_dir, steps) -> str:
    logger = WandbLogger.in_run_dir(str(run_dir), project="p")
    for step in steps:
        logger.log_metrics({"train/loss": loss(step)}, step)
    return finish(logger)


def test_wandb_resume_skips_the_steps_its_files_hold_and_fills_the_rest(tmp_path):
    # The killed attempt's file holds steps 1-8, the checkpoint is at 6: 7 and 8 stay as they were logged.
    finished_wandb_run(tmp_path / "held", range(1, 9))
    resumed = WandbLogger.in_run_dir(str(tmp_path / "held"), project="p")
    resumed.resume_at(6, history(range(1, 7)), dropped_from=7)
    for step in range(7, 11):
        resumed.log_metrics({"train/loss": loss(step, attempt=1)}, step)
    finish(resumed)
    assert wandb_steps(tmp_path / "held") == [(s, loss(s)) for s in range(1, 9)] + [(9, loss(9, 1)), (10, loss(10, 1))]

    # The killed attempt's file holds its header only (as after kill -9): steps 1-6 come from the history.
    path = finished_wandb_run(tmp_path / "lost", range(1, 9))
    with open(path, "r+b") as f:
        f.truncate(7)
    resumed = WandbLogger.in_run_dir(str(tmp_path / "lost"), project="p")
    resumed.resume_at(6, history(range(1, 7)), dropped_from=7)
    for step in range(7, 9):
        resumed.log_metrics({"train/loss": loss(step, attempt=1)}, step)
    finish(resumed)
    assert wandb_steps(tmp_path / "lost") == [(s, loss(s)) for s in range(1, 7)] + [(7, loss(7, 1)), (8, loss(8, 1))]


def test_a_wandb_file_cut_short_anywhere_reads_as_a_prefix_of_its_rows(tmp_path):
    path = finished_wandb_run(tmp_path, range(1, 41))
    data = open(path, "rb").read()
    assert history_steps(path) == list(range(1, 41))
    for cut in range(7, len(data), max(1, len(data) // 97)):
        with open(tmp_path / "cut.wandb", "wb") as f:
            f.write(data[:cut])
        steps = history_steps(str(tmp_path / "cut.wandb"))
        assert steps == list(range(1, len(steps) + 1)), cut


def test_resume_without_a_file_logger_says_what_cannot_be_filled(tmp_path, caplog):
    logger = TensorBoardLogger.in_run_dir(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="trainer.loggers.resume_history"):
        resume_loggers([logger], 6, None)
    logger.finalize()
    assert "without a jsonl or csv logger" in caplog.text


def test_wandb_config_given_to_the_logger_is_kept_beside_the_runs(tmp_path, caplog):
    with pytest.raises(TypeError, match=r"WandbLogger\(config='lr=0.1'\) must be a mapping"):
        WandbLogger(save_dir=str(tmp_path), config="lr=0.1")
    logger = WandbLogger(save_dir=str(tmp_path), project="p", config={"team": "vision", "lr": 0.5})
    with caplog.at_level(logging.WARNING, logger="trainer.loggers.wandb_logger"):
        logger.log_hyperparams({"lr": 0.1, "optimizer": {"name": "sgd"}})
    _, config, _ = wandb_run(finish(logger))
    assert "WandbLogger(config=...) sets ['lr']" in caplog.text
    assert {k: config[k] for k in ("team", "lr", "optimizer")} == {"team": "vision", "lr": 0.5, "optimizer": {"name": "sgd"}}


def test_wandb_run_resumed_into_a_new_run_directory_is_filled_from_the_checkpoints_run(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    jsonl = JSONLLogger(str(old))
    for step in range(1, 9):
        jsonl.log_metrics({"train/loss": loss(step)}, step)
    path = finished_wandb_run(old, range(1, 4))  # W&B wrote steps 1-3 only, the checkpoint is at 6
    adopt_run_id(str(old), str(new))
    wandb = WandbLogger.in_run_dir(str(new), project="p")
    resume_loggers([JSONLLogger(str(new)), wandb], 6, 6, checkpoint_run_dir=str(old))
    for step in (7, 8):
        wandb.log_metrics({"train/loss": loss(step, attempt=1)}, step)
    finish(wandb)
    assert os.path.getsize(path) > 7  # (the old directory's files stay as they were)
    assert [json.loads(line)["step"] for line in open(old / "metrics.jsonl")] == list(range(1, 9))
    assert wandb_steps(old) + wandb_steps(new) == [(s, loss(s)) for s in range(1, 7)] + [(7, loss(7, 1)), (8, loss(8, 1))]


def test_a_logger_that_wrote_nothing_yet_resumes_too(tmp_path):
    # No config was logged, so no folder or file exists at the resume: nothing to drop or fill, no error.
    folder = tmp_path / "fresh"
    tensorboard, csv_logger = TensorBoardLogger.in_run_dir(str(folder)), CSVLogger.in_run_dir(str(folder))
    resume_loggers([tensorboard, csv_logger], 2, None)
    JSONLLogger(str(tmp_path / "empty")).cut_to_checkpoint(2, 5)
    tensorboard.finalize()
    assert tensorboard_scalars(folder) == {} and not (folder / "metrics.csv").exists()
    assert not (tmp_path / "empty" / "metrics.jsonl").exists()
