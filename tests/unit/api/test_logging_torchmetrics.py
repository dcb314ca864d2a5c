"""torchmetrics objects logged with ``self.log`` / ``self.log_dict`` (tests/support/metrics_program.py, a
Lightning program run as written under Lightning and with its import rewritten under this trainer):
the same logged values as Lightning on one process (1e-5), sanity pass and epoch resets included,
``trainer.callback_metrics`` holding the current batch's values in ``on_train_batch_end``. (2 ranks
against one process: tests/multiprocess/api/test_logging_torchmetrics_ranks.py.)"""

from __future__ import annotations

import pytest

from tests.support.metrics_program_runs import EPOCHS, TOL, lightning_run, our_run

pytestmark = pytest.mark.timeout(300)

LOGGED = ["train/acc_step", "train/acc_epoch", "train/loss", "probe/loss", "val/loss", "val/acc", "val/count",
          "val/f1", "val/precision", "test/acc"]


@pytest.mark.parametrize("sanity, track_best", [(2, False), (0, True)])
def test_the_same_logged_values_as_lightning(tmp_path, sanity, track_best):
    # Sanity pass on: Lightning resets the metrics it fed, so epoch 0 counts 32 validation samples, not 48.
    # (With best tracking the sanity pass is off: Lightning runs on_validation_epoch_end in it, this
    # trainer does not, so a MaxMetric fed there would differ; programs reset it in on_train_start.)
    args = dict(num_sanity_val_steps=sanity, track_best=track_best)
    theirs, their_seen = lightning_run(**args)
    ours, our_seen = our_run(tmp_path, **args)
    keys = LOGGED + (["val/acc_best"] if track_best else [])
    for key in keys:
        assert ours.get(key) == pytest.approx(theirs[key], **TOL), key
    assert len(ours["train/acc_step"]) == EPOCHS * 8 and len(ours["val/acc"]) == EPOCHS and len(ours["test/acc"]) == 1
    assert ours["val/count"] == [32.0] * EPOCHS  # reset after the sanity pass and after each epoch
    # the user's epoch train/loss is the one value under that name (the trainer's own per-step loss is not written)
    assert len(ours["train/loss"]) == EPOCHS
    # callback_metrics in on_train_batch_end: that batch's values, as in Lightning
    assert our_seen == pytest.approx(their_seen, **TOL) and our_seen == pytest.approx(ours["train/acc_step"], **TOL)
    if track_best:
        acc, best = ours["val/acc"], ours["val/acc_best"]
        assert best == pytest.approx([max(acc[: i + 1]) for i in range(len(acc))], **TOL)  # a best, not a running mean
