"""Every hook in Lightning's order: one traced program (tests/support/hook_trace.py) runs under
Lightning itself and under this trainer, and the two sequences of hook calls (module, datamodule and
a callback, in one list) must be equal, call for call, over fit (sanity check, two epochs,
validation, checkpoints), validate, test and predict; with gradient accumulation and clipping; with
a DataModule; and on a resumed fit.

Left out of the comparison, by design: where the ``*_dataloader`` hooks run (here at set-up, before
the model is wrapped: the global-batch plan needs the data first; Lightning calls them lazily), our
own ``on_train_step_end``, and on a resumed fit where ``configure_optimizers`` runs (here before the
checkpoint hooks: the optimizer state is read in one sharded load with the weights; Lightning builds
the optimizers after restoring the module, datamodule and callbacks).
"""

from __future__ import annotations

import types

import pytest

from tests.support.hook_trace import BATCH, comparable, program

lightning = pytest.importorskip("lightning.pytorch", reason="Lightning (a dev dependency) is the oracle")


def _ours_api():
    from trainer import DataModule, TrainModule
    from trainer.api.callback import Callback

    return types.SimpleNamespace(Module=TrainModule, DataModule=DataModule, Callback=Callback)


def _lightning_api():
    return types.SimpleNamespace(Module=lightning.LightningModule, DataModule=lightning.LightningDataModule,
                                 Callback=lightning.Callback)


def _run_lightning(tmp_path, stages, *, accumulate=1, clip=None, datamodule=False, resume=False, manual=False):
    calls: list = []
    module, data, callback = program(_lightning_api(), calls, datamodule=datamodule, manual=manual)

    def trainer(max_epochs):
        return lightning.Trainer(
            accelerator="cpu", devices=1, max_epochs=max_epochs, num_sanity_val_steps=2, enable_progress_bar=False,
            logger=False, enable_model_summary=False, default_root_dir=str(tmp_path / "lightning"), callbacks=[callback],
            accumulate_grad_batches=accumulate, gradient_clip_val=clip)

    first = trainer(1 if resume else 2)
    if resume:
        first.fit(module, datamodule=data)
        calls.append(("---", "resume"))
        first = trainer(2)
        first.fit(module, datamodule=data, ckpt_path=str(next((tmp_path / "lightning").rglob("*.ckpt"))))
        return calls
    for stage in stages:
        calls.append(("---", stage))
        getattr(first, stage)(module, datamodule=data)
    return calls


def _run_ours(tmp_path, stages, *, accumulate=1, clip=None, datamodule=False, resume=False, manual=False):
    from trainer import Trainer

    calls: list = []
    module, data, callback = program(_ours_api(), calls, datamodule=datamodule, manual=manual)

    def trainer(max_epochs):
        return Trainer(
            max_epochs=max_epochs, num_sanity_val_steps=2, check_val_every_n_epoch=1, progress_bar=False, loggers=[],
            enable_model_summary=False, run_dir=str(tmp_path / "ours"), callbacks=[callback], batch_size=BATCH,
            accumulate_grad_batches=accumulate, gradient_clip_val=clip, checkpoint={"every_n_epochs": 1})

    first = trainer(1 if resume else 2)
    if resume:
        first.fit(module, datamodule=data)
        calls.append(("---", "resume"))
        trainer(2).fit(module, datamodule=data, ckpt_path="last")
        return calls
    for stage in stages:
        calls.append(("---", stage))
        getattr(first, stage)(module, datamodule=data)
    return calls


def _same(lightning_calls, our_calls, leave_out=()):
    expected, got = comparable(lightning_calls, leave_out), comparable(our_calls, leave_out)
    if expected != got:
        import difflib

        diff = "\n".join(difflib.unified_diff([" ".join(c) for c in expected], [" ".join(c) for c in got],
                                              "lightning", "ours", lineterm="", n=2))
        raise AssertionError(f"hook sequences differ:\n{diff}")


@pytest.mark.parametrize("datamodule", [False, True], ids=["module-data", "datamodule"])
def test_fit_validate_test_predict_call_every_hook_in_lightnings_order(tmp_path, datamodule):
    stages = ("fit", "validate", "test", "predict")
    _same(_run_lightning(tmp_path, stages, datamodule=datamodule), _run_ours(tmp_path, stages, datamodule=datamodule))


def test_accumulation_and_clipping_call_the_step_hooks_in_lightnings_order(tmp_path):
    _same(_run_lightning(tmp_path, ("fit",), accumulate=2, clip=1.0), _run_ours(tmp_path, ("fit",), accumulate=2, clip=1.0))


def test_a_resumed_fit_calls_the_checkpoint_hooks_in_lightnings_order(tmp_path):
    _same(_run_lightning(tmp_path, (), resume=True, datamodule=True), _run_ours(tmp_path, (), resume=True, datamodule=True),
          leave_out=("configure_optimizers",))


def test_manual_optimization_calls_the_backward_and_step_hooks_in_lightnings_order(tmp_path):
    _same(_run_lightning(tmp_path, ("fit",), manual=True), _run_ours(tmp_path, ("fit",), manual=True))
