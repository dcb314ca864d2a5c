"""Callback hooks in Lightning's shape: ``(trainer, module, ...)`` with the Trainer object and the
user's module, in order, the batch hooks once per micro-batch (as Lightning), the callbacks' hook
before the module's of the same name (Lightning's order; the whole order against Lightning itself:
test_lightning_hook_order.py); hooks of the former shape are refused when the Trainer is built."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.support.helpers import Regressor, run_trainer
from trainer import Trainer
from trainer.callbacks import Callback, run_of

pytestmark = pytest.mark.timeout(240)

HOOKS = ("on_fit_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end", "on_train_step_end",
         "on_validation_epoch_start", "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end",
         "on_train_epoch_end", "on_fit_end")


class Recorder(Callback):
    """Records (hook, detail) for every hook, checking the trainer and module it is given."""

    def __init__(self, calls: list | None = None):
        self.calls = [] if calls is None else calls
        self.trainers, self.modules = set(), set()

    def _record(self, hook, trainer, module, detail=None):
        assert isinstance(trainer, Trainer), (hook, trainer)
        self.trainers.add(id(trainer))
        self.modules.add(id(module))
        self.calls.append(("callback", hook, detail))

    def on_fit_start(self, trainer, module):
        self._record("on_fit_start", trainer, module)

    def on_train_epoch_start(self, trainer, module):
        self._record("on_train_epoch_start", trainer, module)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._record("on_train_batch_start", trainer, module, batch_idx)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # as Lightning builds it: the loss detached (divided by the micro-batches of the step), on the device
        assert isinstance(outputs["loss"], torch.Tensor) and not outputs["loss"].requires_grad
        self._record("on_train_batch_end", trainer, module, batch_idx)

    def on_train_step_end(self, trainer, module, step, metrics):
        self._record("on_train_step_end", trainer, module, step)

    def on_validation_epoch_start(self, trainer, module):
        self._record("on_validation_epoch_start", trainer, module)

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._record("on_validation_batch_end", trainer, module, batch_idx)

    def on_validation_epoch_end(self, trainer, module):
        self._record("on_validation_epoch_end", trainer, module)

    def on_validation_end(self, trainer, module, metrics):
        self._record("on_validation_end", trainer, module, sorted(metrics))

    def on_train_epoch_end(self, trainer, module):
        self._record("on_train_epoch_end", trainer, module, run_of(trainer).epoch)

    def on_fit_end(self, trainer, module):
        self._record("on_fit_end", trainer, module, run_of(trainer).step)
        run = run_of(trainer)
        counts = {hook: sum(1 for c in self.calls if c[1] == hook) for hook in HOOKS}
        with open(os.path.join(run.run_dir, f"hook_counts_rank{run.rank}.json"), "w") as f:
            json.dump(counts, f)


class ModuleRecorder(Regressor):
    """The module's Lightning hooks, recorded in the same list (they run after the callbacks')."""

    def __init__(self, calls: list, **kwargs):
        super().__init__(**kwargs)
        self.calls = calls

    def on_train_epoch_start(self):
        self.calls.append(("module", "on_train_epoch_start", None))

    def on_train_batch_start(self, batch, batch_idx):
        self.calls.append(("module", "on_train_batch_start", batch_idx))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.calls.append(("module", "on_train_batch_end", batch_idx))

    def on_validation_epoch_start(self):
        self.calls.append(("module", "on_validation_epoch_start", None))

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        self.calls.append(("module", "on_validation_batch_end", batch_idx))

    def on_validation_epoch_end(self):
        self.calls.append(("module", "on_validation_epoch_end", None))


def expected_calls(epochs: int, steps_per_epoch: int, accumulate: int, val_batches: int) -> list[tuple]:
    """The callback's calls for ``val_every_n_steps = steps_per_epoch`` (validation at each epoch's end),
    after a sanity pass of 2 batches (its hooks run and see its metrics, which are not logged)."""
    calls = [("on_fit_start", None), ("on_validation_epoch_start", None), ("on_validation_batch_end", 0),
             ("on_validation_batch_end", 1), ("on_validation_epoch_end", None), ("on_validation_end", ["val/loss"])]
    step = 0
    for epoch in range(epochs):
        calls.append(("on_train_epoch_start", None))
        for index in range(steps_per_epoch):
            for micro in range(accumulate):
                batch_idx = index * accumulate + micro
                calls += [("on_train_batch_start", batch_idx), ("on_train_batch_end", batch_idx)]
            step += 1
            calls.append(("on_train_step_end", step))
        calls += [("on_validation_epoch_start", None), *[("on_validation_batch_end", i) for i in range(val_batches)],
                  ("on_validation_epoch_end", None), ("on_validation_end", ["val/loss"]),
                  ("on_train_epoch_end", epoch)]
    return calls + [("on_fit_end", step)]


def test_hooks_get_trainer_and_module_in_order_per_micro_batch(tmp_path):
    calls: list = []
    callback, module = Recorder(calls), ModuleRecorder(calls, val_samples=16)
    trainer = Trainer(run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False, callbacks=[callback], batch_size=4,
                      accumulate_grad_batches=2, max_steps=-1, max_epochs=2, limit_train_batches=2, val_every_n_steps=2)
    trainer.fit(module)
    # The sanity pass (2 batches, the default) calls the validation hooks too, as Lightning.
    assert [c[1:] for c in calls if c[0] == "callback"] == expected_calls(2, 2, 2, 4)
    assert callback.trainers == {id(trainer)} and callback.modules == {id(module)}
    # Where the module has the hook, its call comes right after the callback's, with the same detail.
    for index, (who, hook, detail) in enumerate(calls):
        if who == "module":
            assert calls[index - 1] == ("callback", hook, detail), calls[index - 1: index + 1]


def test_batch_hooks_count_micro_batches_on_two_ranks(tmp_path):
    run_trainer(tmp_path, Regressor(val_samples=16), strategy="ddp", devices=2, batch_size=4, accumulate_grad_batches=3,
                max_steps=2, collective_timeout_s=60, callbacks=[Recorder()])
    for rank in (0, 1):
        with open(tmp_path / f"hook_counts_rank{rank}.json") as f:
            counts = json.load(f)
        # 2 steps x 3 micro-batches on each rank; the sanity pass (2 global batches of 2 x 4 samples: this
        # rank's 2 batches) and one validation pass of this rank's 2 batches (16 / 2 ranks / 4).
        assert counts["on_train_batch_start"] == counts["on_train_batch_end"] == 6, (rank, counts)
        assert counts["on_train_step_end"] == 2 and counts["on_validation_batch_end"] == 2 + 2, (rank, counts)
        assert counts["on_fit_start"] == counts["on_fit_end"] == 1 and counts["on_validation_end"] == 2


class OldFitStart(Callback):
    def on_fit_start(self, run):
        pass


class OldEpochEnd(Callback):
    def on_train_epoch_end(self, run, epoch):
        pass


class LightningValidationEnd(Callback):
    def __init__(self):
        self.metrics = []

    def on_validation_end(self, trainer, pl_module):  # Lightning's shape: called without our metrics
        self.metrics.append(dict(trainer.callback_metrics))


@pytest.mark.parametrize("callback, message", [
    (OldFitStart(), r"OldFitStart.on_fit_start does not take \(trainer, module\): callback hooks have Lightning's "
                    r"shape on_fit_start\(self, trainer, module\); .*run_of\(trainer\)"),
    (OldEpochEnd(), r"OldEpochEnd.on_train_epoch_end does not take \(trainer, module\)"),
])
def test_a_hook_of_the_former_shape_is_refused_when_the_trainer_is_built(callback, message):
    with pytest.raises(TypeError, match=message):
        Trainer(callbacks=[callback])


def test_lightnings_on_validation_end_shape_is_called_without_the_metrics(tmp_path):
    callback = LightningValidationEnd()
    run_trainer(tmp_path, Regressor(val_samples=8), max_steps=2, val_every_n_steps=2, callbacks=[callback])
    assert len(callback.metrics) == 2  # the sanity pass, then step 2's
    assert "val/loss" in callback.metrics[-1]


class CheckpointHooks(Callback):
    def __init__(self):
        self.loaded = None

    def on_save_checkpoint(self, trainer, module, checkpoint):
        assert isinstance(trainer, Trainer)
        checkpoint["mine"] = checkpoint["step"] * 10

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.loaded = dict(checkpoint)


def test_checkpoint_hooks_add_to_the_checkpoint_and_get_it_back(tmp_path):
    checkpoint = dict(dir=str(tmp_path / "checkpoints"), every_n_steps=2)
    run_trainer(tmp_path / "first", Regressor(), max_steps=2, checkpoint=checkpoint, callbacks=[CheckpointHooks()])
    resumed = CheckpointHooks()
    run_trainer(tmp_path / "second", Regressor(), max_steps=3, checkpoint=checkpoint, resume="auto", callbacks=[resumed])
    assert resumed.loaded == {"step": 2, "epoch": 0, "mine": 20}
    fresh = CheckpointHooks()
    run_trainer(tmp_path / "fresh", Regressor(), max_steps=1, callbacks=[fresh])
    assert fresh.loaded is None  # nothing restored: not called


def test_module_hooks_of_lightnings_shape_without_arguments_are_called(tmp_path):
    # A LightningModule's on_train_epoch_end(self) / on_validation_end(self) take no argument; ours
    # pass the epoch / the metrics. Both shapes are called; a wrong shape still raises.
    from trainer.api.hook_calls import call_module_hook

    class LightningShaped(Regressor):
        def __init__(self):
            super().__init__(num_samples=64, val_samples=16)
            self.calls = []

        def on_train_epoch_end(self):
            self.calls.append(("epoch_end", self.current_epoch))

        def on_validation_end(self):
            self.calls.append(("validation_end", dict(self.trainer.callback_metrics).get("val/loss") is not None))

    module = LightningShaped()
    run_trainer(tmp_path, module, max_steps=-1, max_epochs=2, batch_size=32, num_sanity_val_steps=0)
    assert module.calls == [("epoch_end", 0), ("epoch_end", 1), ("validation_end", True)]

    class Ours(Regressor):
        def on_train_epoch_end(self, epoch):
            self.seen = epoch

    ours = Ours()
    call_module_hook(ours, "on_train_epoch_end", 3)
    assert ours.seen == 3

    class Wrong(Regressor):
        def on_train_epoch_end(self, epoch, extra):
            pass

    with pytest.raises(TypeError):
        call_module_hook(Wrong(), "on_train_epoch_end", 3)
