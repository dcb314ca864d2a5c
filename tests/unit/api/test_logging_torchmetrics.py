"""torchmetrics objects logged with ``self.log`` / ``self.log_dict`` (tests/support/metrics_program.py, a
Lightning program run as written under Lightning and with its import rewritten under this trainer):
the same logged values as Lightning on one process (1e-5), sanity pass and epoch resets included,
``trainer.callback_metrics`` holding the current batch's values in ``on_train_batch_end``; and 2 DDP
ranks / 2 FSDP ranks equal to one process, on a validation set the ranks split unevenly (FSDP adds a
padding batch there, whose metric updates are undone)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.support.helpers import new_trainer, read_metrics

pytestmark = pytest.mark.timeout(300)

TOL = dict(rel=1e-5, abs=1e-6)
EPOCHS = 2


def _lightning(**hparams):
    """The program under Lightning: {key: [values in order]} of what its logger received, and the probe's."""
    import lightning.pytorch as L
    from lightning.pytorch.loggers.logger import Logger

    import tests.support.metrics_program as program

    class Recorder(Logger):
        name, version = "recorder", 0

        def __init__(self):
            super().__init__()
            self.records = []

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            self.records.append({k: float(v) for k, v in metrics.items()})

    sanity = hparams.pop("num_sanity_val_steps")
    torch.manual_seed(0)
    module, probe, recorder = program.LitClassifier(**hparams), program.BatchMetricsProbe(), Recorder()
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=recorder, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1,
                        num_sanity_val_steps=sanity, callbacks=[probe])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
        trainer.test(module, verbose=False)
    return _by_key(recorder.records), probe.seen


def _ours(run_dir, devices=1, strategy="single", **hparams):
    import tests.support.metrics_program_ours as program

    sanity = hparams.pop("num_sanity_val_steps")
    batch_size = hparams.pop("batch_size", 8)
    torch.manual_seed(0)
    module, probe = program.LitClassifier(batch_size=batch_size // devices, **hparams), program.BatchMetricsProbe()
    trainer = new_trainer(run_dir, max_steps=-1, max_epochs=EPOCHS, check_val_every_n_epoch=1, strategy=strategy,
                          devices=devices, num_sanity_val_steps=sanity, callbacks=[probe])
    trainer.fit(module)
    trainer.test()
    return _by_key(read_metrics(str(run_dir))), probe.seen


def _by_key(records):
    out = {}
    for record in records:
        for key, value in record.items():
            out.setdefault(key, []).append(value)
    return out


LOGGED = ["train/acc_step", "train/acc_epoch", "train/loss", "probe/loss", "val/loss", "val/acc", "val/count",
          "val/f1", "val/precision", "test/acc"]


@pytest.mark.parametrize("sanity, track_best", [(2, False), (0, True)])
def test_the_same_logged_values_as_lightning(tmp_path, sanity, track_best):
    # Sanity pass on: Lightning resets the metrics it fed, so epoch 0 counts 32 validation samples, not 48.
    # (With best tracking the sanity pass is off: Lightning runs on_validation_epoch_end in it, this
    # trainer does not, so a MaxMetric fed there would differ; programs reset it in on_train_start.)
    args = dict(num_sanity_val_steps=sanity, track_best=track_best)
    theirs, their_seen = _lightning(**args)
    ours, our_seen = _ours(tmp_path, **args)
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


EXACT_ON_ANY_WORLD = ["train/acc_step", "train/acc_epoch", "train/loss", "probe/loss", "val/acc", "val/count",
                      "val/f1", "val/precision", "val/acc_best", "test/acc"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process(tmp_path, strategy):
    # 33 validation (and test) samples: ranks hold 17 and 16 (5 and 4 batches of 4; FSDP pads rank 1 with a batch
    # that must not count). val/loss is a MeanMetric of batch means, which depends on how the set is
    # batched, so it is left out; every other value is exact on any world size.
    args = dict(num_sanity_val_steps=2, track_best=True, val_samples=33)
    one, _ = _ours(tmp_path / "one", **args)
    two, _ = _ours(tmp_path / strategy, devices=2, strategy=strategy, **args)
    assert one["val/count"] == [33.0] * EPOCHS
    for key in EXACT_ON_ANY_WORLD:
        assert two.get(key) == pytest.approx(one[key], **TOL), key
