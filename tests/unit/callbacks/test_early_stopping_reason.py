"""The Lightning mirror's ``EarlyStopping.stopping_reason``: which check stopped the run, with
Lightning's enum values, kept in the callback's state."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.lightning.callbacks.early_stopping import EarlyStopping, EarlyStoppingReason


@pytest.mark.parametrize("values, settings, reason", [
    ([1.0, 1.0, 1.0], {"patience": 2}, EarlyStoppingReason.PATIENCE_EXHAUSTED),
    ([1.0, 0.05], {"stopping_threshold": 0.1}, EarlyStoppingReason.STOPPING_THRESHOLD),
    ([1.0, 9.0], {"divergence_threshold": 5.0}, EarlyStoppingReason.DIVERGENCE_THRESHOLD),
    ([1.0, math.nan], {}, EarlyStoppingReason.NON_FINITE_METRIC),
])
def test_the_check_that_stops_is_the_reason(values, settings, reason):
    callback = EarlyStopping("val/loss", **settings)
    assert callback.stopping_reason is EarlyStoppingReason.NOT_STOPPED
    messages = [callback._reason_to_stop(value, step) for step, value in enumerate(values)]
    assert messages[:-1] == [None] * (len(values) - 1) and messages[-1] is not None
    assert callback.stopping_reason is reason
    assert callback.stopping_reason_message == messages[-1]

    restored = EarlyStopping("val/loss", **settings)
    restored.load_state_dict(callback.state_dict())
    assert (restored.stopping_reason, restored.stopping_reason_message) == (reason, messages[-1])


def test_the_values_are_lightnings():
    lightning = pytest.importorskip("lightning.pytorch.callbacks.early_stopping")
    assert {m.name: m.value for m in EarlyStoppingReason} == {m.name: m.value for m in lightning.EarlyStoppingReason}


def test_lightnings_attributes_follow_the_checks():
    callback = EarlyStopping("val_loss", patience=2)
    assert callback.state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"
    assert (callback.wait_count, callback.stopped_epoch, float(callback.best_score)) == (0, 0, math.inf)
    assert callback._evaluate_stopping_criteria(torch.tensor(3.0))[0] is False
    assert float(callback.best_score) == 3.0
    assert callback._evaluate_stopping_criteria(torch.tensor(4.0)) == (False, None) and callback.wait_count == 1
    stop, reason = callback._evaluate_stopping_criteria(torch.tensor(5.0))
    assert stop and "did not improve" in reason and callback.wait_count == 2


def test_patience_zero_stops_at_the_first_miss_as_lightning():
    ours = EarlyStopping("m", patience=0)
    theirs = pytest.importorskip("lightning.pytorch.callbacks").EarlyStopping("m", patience=0)
    for value in (2.0, 1.0, 1.5):
        mine, lightning = ours._evaluate_stopping_criteria(torch.tensor(value)), \
            theirs._evaluate_stopping_criteria(torch.tensor(value))
        assert mine[0] == lightning[0]
    assert ours.stopping_reason.value == theirs.stopping_reason.value == EarlyStoppingReason.PATIENCE_EXHAUSTED.value


def test_an_unknown_mode_is_lightnings_error():
    from trainer.lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="`mode` can be min, max, got up"):
        EarlyStopping("m", mode="up")


def test_lightnings_state_and_an_older_one_load():
    callback = EarlyStopping("m")
    callback.load_state_dict({"wait_count": 2, "stopped_epoch": 5, "best_score": torch.tensor(0.5), "patience": 3})
    assert (callback.wait_count, callback.stopped_epoch, float(callback.best_score)) == (2, 5, 0.5)
    assert callback.stopping_reason is EarlyStoppingReason.NOT_STOPPED and callback.stopping_reason_message is None
    state = callback.state_dict()
    assert {"wait_count", "stopped_epoch", "best_score", "patience", "stopping_reason"} <= set(state)
    again = EarlyStopping("m")
    again.load_state_dict(state)
    assert again.state_dict().keys() == state.keys() and again.wait_count == 2
