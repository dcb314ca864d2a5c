"""The Lightning mirror's ``EarlyStopping.stopping_reason``: which check stopped the run, with
Lightning's enum values, kept in the callback's state."""

from __future__ import annotations

import math

import pytest

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
