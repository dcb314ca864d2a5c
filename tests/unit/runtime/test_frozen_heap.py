"""The set-up's objects are left out of the garbage collector's scans while a run trains or
evaluates, and given back when it ends; a program's own collector settings are left alone."""

from __future__ import annotations

import gc
import weakref

import pytest

from tests.support.helpers import Regressor, run_trainer
from trainer.runtime.frozen_heap import frozen_heap


class _Node:
    def __init__(self):
        self.other = self


class FreezeSeen(Regressor):
    """Records, at each training / validation step, how many objects the collector leaves out."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.frozen_counts: list[int] = []

    def training_step(self, batch, batch_idx):
        self.frozen_counts.append(gc.get_freeze_count())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.frozen_counts.append(gc.get_freeze_count())
        return super().validation_step(batch, batch_idx)


def test_objects_from_before_are_frozen_and_given_back():
    before = _Node()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(before)
        # A cycle created before the block and dropped inside it is not collected inside ...
        ref = weakref.ref(before)
        del before
        gc.collect()
        assert ref() is not None
        # ... while one created inside the block is collected as usual.
        inner = _Node()
        inner_ref = weakref.ref(inner)
        del inner
        gc.collect()
        assert inner_ref() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None  # given back: collected after the block


def test_a_disabled_collector_or_a_program_s_own_freeze_is_left_alone():
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == count  # not unfrozen behind the program's back
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("call", ["fit", "validate"])
def test_a_run_trains_and_evaluates_with_the_set_up_frozen(tmp_path, call):
    module = FreezeSeen(val_samples=32)
    trainer_args = dict(max_steps=3, limit_val_batches=1)
    if call == "fit":
        run_trainer(tmp_path, module, **trainer_args)
    else:
        from tests.support.helpers import new_trainer

        new_trainer(tmp_path, **trainer_args).validate(module)
    assert module.frozen_counts and all(count > 0 for count in module.frozen_counts)
    assert gc.get_freeze_count() == 0
