"""A module's ``self.logger.experiment.add_image(...)`` on 2 ranks: every rank runs the call, rank 0's
logger writes it once; the version folder is the one the caller's logger object names."""

from __future__ import annotations

import pytest

from tests.unit.loggers.test_lightning_loggers import events, fit_with
from trainer.loggers import TensorBoardLogger

pytestmark = pytest.mark.timeout(240)


def test_image_grid_from_every_rank_is_written_once_by_rank_zero(tmp_path):
    logger = TensorBoardLogger(str(tmp_path / "tb"))
    trainer, _ = fit_with(logger, tmp_path, strategy="ddp", devices=2)
    assert logger.log_dir == str(tmp_path / "tb" / "lightning_logs" / "version_0")
    read = events(logger.log_dir)
    assert [image.step for image in read.Images("generated_images")] == [0, 1]  # once per epoch, not per rank
    assert abs(read.Scalars("g_loss")[-1].value - trainer.logged_metrics["g_loss"]) < 1e-6
