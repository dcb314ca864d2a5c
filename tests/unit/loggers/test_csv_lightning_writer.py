"""CSVLogger's Lightning writer behaviour: ``save()`` every ``flush_logs_every_n_steps`` steps with
``experiment.metrics`` holding the rows since the last one (every row on disk as it is written), and
Lightning's warning when a version folder given by hand already holds files (its metrics.csv replaced)."""

from __future__ import annotations

import pytest

from trainer.loggers import CSVLogger


def test_save_every_n_steps_empties_the_rows_since_the_last_save(tmp_path):
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    logger.log_metrics({"a": 1.0}, step=0)
    assert [row["a"] for row in logger.experiment.metrics] == [1.0]
    logger.log_metrics({"a": 2.0}, step=1)  # (step + 1) % 2 == 0: saved
    assert logger.experiment.metrics == []
    with open(logger.path) as f:
        assert f.read().splitlines() == ["step,a", "0,1.0", "1,2.0"]  # on disk before any save
    logger.finalize()


def test_a_version_given_by_hand_whose_folder_holds_files_is_replaced_with_a_warning(tmp_path):
    folder = tmp_path / "exp" / "version_0"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,old\n0,1\n")
    logger = CSVLogger(tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="Experiment logs directory .* exists and is not empty"):
        logger.log_metrics({"new": 2.0}, step=0)
    logger.finalize()
    assert (folder / "metrics.csv").read_text().splitlines() == ["step,new", "0,2.0"]
    fresh = CSVLogger(tmp_path, name="exp")  # the next free version: nothing to replace, no warning
    assert fresh.version == 1
