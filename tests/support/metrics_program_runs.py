"""Runs of tests/support/metrics_program.py under Lightning and under this trainer (its import
rewritten): what each logged, as ``{key: [values in order]}``, and what its probe callback saw."""

from __future__ import annotations

import warnings

import torch

from tests.support.helpers import new_trainer, read_metrics

TOL = dict(rel=1e-5, abs=1e-6)
EPOCHS = 2


def lightning_run(**hparams):
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
    return by_key(recorder.records), probe.seen


def our_run(run_dir, devices=1, strategy="single", **hparams):
    import tests.support.metrics_program_ours as program

    sanity = hparams.pop("num_sanity_val_steps")
    batch_size = hparams.pop("batch_size", 8)
    torch.manual_seed(0)
    module, probe = program.LitClassifier(batch_size=batch_size // devices, **hparams), program.BatchMetricsProbe()
    trainer = new_trainer(run_dir, max_steps=-1, max_epochs=EPOCHS, check_val_every_n_epoch=1, strategy=strategy,
                          devices=devices, num_sanity_val_steps=sanity, callbacks=[probe])
    trainer.fit(module)
    trainer.test()
    return by_key(read_metrics(str(run_dir))), probe.seen


def by_key(records):
    out = {}
    for record in records:
        for key, value in record.items():
            out.setdefault(key, []).append(value)
    return out
