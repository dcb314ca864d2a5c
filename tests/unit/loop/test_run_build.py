"""A run is built in one place and runs without writing into the Trainer, and every hook comes from
the one dispatcher (trainer/loop/hooks.py)."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from tests.support.helpers import Regressor, new_trainer
from trainer import Trainer
from trainer.callbacks import Callback
from trainer.api.hook_table import RECEIVERS
from trainer.loop import hooks as dispatcher_module
from trainer.loop.fit_build import build_fit
from trainer.loop.run_build import build_run
from trainer.loop.run_parts import PART_NAMES

#: the module hooks whose default does the work, called through RunHooks.call_module
MODEL_MODE_HOOKS = ("on_validation_model_zero_grad", "on_validation_model_eval", "on_validation_model_train",
                    "on_test_model_eval", "on_test_model_train", "on_predict_model_eval")


def _from_dispatcher() -> bool:
    """Whether a method of the dispatcher (trainer/loop/hooks.py) is on the call stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == dispatcher_module.__file__:
            return True
        frame = frame.f_back
    return False


def _recorder(kind: str, name: str):
    def hook(self, *args, **kwargs):
        self.calls.append((kind, name, _from_dispatcher()))
        base = getattr(super(type(self), self), name)
        return base(*args, **kwargs)
    return hook


class EveryHookCallback(Callback):
    """Overrides every callback hook of the table, recording each call."""

    def __init__(self, calls: list):
        self.calls = calls


class EveryHookModule(Regressor):
    """Overrides every module hook of the table, recording each call."""

    def __init__(self, calls: list):
        super().__init__(num_samples=64, val_samples=16)
        self.calls = calls

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def test_dataset(self):
        return self.val_dataset()

    def predict_dataset(self):
        return self.val_dataset()


for _name, _receivers in RECEIVERS.items():
    if "callbacks" in _receivers and hasattr(Callback, _name):
        setattr(EveryHookCallback, _name, _recorder("callback", _name))
    if "module" in _receivers and hasattr(EveryHookModule, _name):
        setattr(EveryHookModule, _name, _recorder("module", _name))


def test_every_hook_comes_from_the_dispatcher_and_the_trainer_is_not_written(tmp_path):
    calls: list = []
    callback = EveryHookCallback(calls)
    written: list[str] = []
    original = Trainer.__setattr__

    def spy(self, name, value):  # every write the live-run guard lets through
        if self._live:
            written.append(name)
        original(self, name, value)

    Trainer.__setattr__ = spy
    try:
        trainer = new_trainer(tmp_path, max_steps=4, val_every_n_steps=2, callbacks=[callback],
                              checkpoint={"every_n_steps": 2})
        module = EveryHookModule(calls)
        trainer.fit(module)
        resumed = new_trainer(tmp_path, max_steps=6, callbacks=[callback], checkpoint={"every_n_steps": 2})
        resumed.fit(module, ckpt_path="last")
        resumed.validate(module)
        resumed.test(module)
        resumed.predict(module)
    finally:
        Trainer.__setattr__ = original
    assert written == [], written  # nothing in the trainer (or a user's hook) assigned a Trainer attribute
    names = {(kind, name) for kind, name, _ in calls}
    for kind in ("module", "callback"):
        for hook in ("setup", "on_fit_start", "on_train_epoch_start", "on_train_batch_end", "on_save_checkpoint",
                     "on_load_checkpoint", "on_validation_end", "on_test_end", "on_predict_end", "teardown"):
            assert (kind, hook) in names, (kind, hook)
    assert ("module", "on_train_epoch_end") in names and ("module", "on_validation_model_eval") in names
    outside = sorted({(kind, name) for kind, name, through in calls if not through})
    assert not outside, f"hooks called outside the dispatcher: {outside}"
    # The checkpoint hooks: once per save (callbacks first, then the module) and once on resume (module first).
    saves = [(k, n) for k, n, _ in calls if n == "on_save_checkpoint"]
    assert saves[:2] == [("callback", "on_save_checkpoint"), ("module", "on_save_checkpoint")]
    loads = [(k, n) for k, n, _ in calls if n == "on_load_checkpoint"]
    assert loads[:2] == [("module", "on_load_checkpoint"), ("callback", "on_load_checkpoint")]


def test_a_write_into_the_trainer_during_a_run_is_refused(tmp_path):
    class SetsAnAttribute(Callback):
        def on_train_start(self, trainer, module):
            trainer.max_steps = 100  # configuration: refused while the run is live

    trainer = new_trainer(tmp_path, max_steps=2, callbacks=[SetsAnAttribute()], checkpoint=None)
    with pytest.raises(AttributeError, match=r"trainer\.max_steps cannot be set while a run is live"):
        trainer.fit(Regressor())
    trainer.max_steps = 3  # between calls it is configuration again
    assert trainer.max_steps == 3


def test_resolved_values_live_in_the_run_and_read_through_the_trainer(tmp_path):
    class LoaderBatch(Regressor):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.train_dataset(), batch_size=8)

    seen = {}

    class Reads(Callback):
        def on_train_start(self, trainer, module):
            seen.update(batch_size=trainer.batch_size, global_batch_size=trainer.global_batch_size,
                        model=trainer.model)

    trainer = new_trainer(tmp_path, max_steps=2, callbacks=[Reads()], checkpoint=None)
    assert trainer.batch_size == 32  # configured: the default until a run reads the module's loader
    trainer.fit(LoaderBatch())
    assert seen["batch_size"] == seen["global_batch_size"] == 8 and seen["model"] is not None
    assert trainer.batch_size == 8 and trainer.model is seen["model"]  # the last call's, after it
    assert "batch_size" not in vars(trainer)  # resolved in the run, not written into the Trainer


def test_parts_are_read_only_once_built(tmp_path, monkeypatch):
    built = {}

    def keep(run):
        build_fit(run)
        built["run"] = run

    monkeypatch.setattr("trainer.loop.entry.build_fit", keep)
    new_trainer(tmp_path, max_steps=1, checkpoint=None).fit(Regressor())
    run = built["run"]
    assert {"strategy", "wrapped", "optimizer", "train_step", "callbacks", "hooks"} <= PART_NAMES
    for name in ("optimizer", "wrapped", "strategy"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(run, name, None)
    with pytest.raises(AttributeError, match="already built"):
        run.install(optimizer=None)
    assert callable(build_run)


def _headings(path: str) -> list[str]:
    """The build's steps as the code names them: its ``# N. heading`` comments, without a "(...)" tail."""
    with open(path, encoding="utf-8") as handle:
        found = re.findall(r"^    # (\d+)\. ([^(\n]+)", handle.read(), flags=re.M)
    assert [int(n) for n, _ in found] == list(range(1, len(found) + 1)), found
    return [text.strip() for _, text in found]


def _listed(text: str, count: int) -> list[str]:
    """The first ``count`` items of the first numbered list in ``text``, backticks dropped."""
    items = re.findall(r"^(\d+)\. (.+)$", text.replace("`", ""), flags=re.M)
    start = next(i for i, (n, _) in enumerate(items) if n == "1")
    return [item for _, item in items[start:start + count]]


def test_the_documented_build_order_is_the_code_order():
    """The architecture page and the build modules' docstrings list the steps the code takes, in its order."""
    import trainer.loop.fit_build as fit_build
    import trainer.loop.run_build as run_build

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "architecture.md"), encoding="utf-8") as f:
        page = f.read()
    page = page[page.index("## The build, in order"):]
    fit_part = page[page.index("Then, for `fit` only"):]
    for module, doc_text in ((run_build, page), (fit_build, fit_part)):
        headings = _headings(module.__file__)
        for listed_in in (module.__doc__, doc_text):
            listed = _listed(listed_in, len(headings))
            assert len(listed) == len(headings), (module.__name__, listed)
            for heading, item in zip(headings, listed):
                assert item.startswith(heading), (module.__name__, heading, item)
