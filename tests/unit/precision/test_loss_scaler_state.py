"""fp16 dynamic loss scaling (trainer/precision/loss_scaler.py): its checkpoint state and its settings.

The stepping rules are tested in test_loss_scaler.py; expected values are derived from the rules.
"""

import math
import random
import re

import pytest
import torch

from tests.unit.precision.test_loss_scaler import INF, NAN, dynamic_state, run_step
from trainer.precision.loss_scaler import DynamicLossScaler


# ----- checkpointing -----------------------------------------------------------------------------------
def overflow_pattern(steps: int, seed: int, p: float) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < p for _ in range(steps)]


def plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return value is None or type(value) in (int, float, bool, str)


@pytest.mark.parametrize("consecutive", [False, True])
def test_state_dict_round_trip_continues_identically(tmp_path, consecutive):
    config = dict(initial_scale_power=10, loss_scale_window=4, hysteresis=3, min_loss_scale=4.0,
                  consecutive_hysteresis=consecutive)
    pattern = overflow_pattern(100, seed=7, p=0.25)

    reference = DynamicLossScaler(**config)
    trace = [(run_step(reference, overflow), *dynamic_state(reference)) for overflow in pattern]
    assert len(set(t[1] for t in trace)) > 2, "the run must move the scale up and down"

    # Save / load after every step: every field must differ from a fresh scaler's at some cut, so a
    # load that forgot one would change the continuation.
    fresh = dynamic_state(DynamicLossScaler(**config))
    for field in range(len(fresh)):
        assert any(t[1 + field] != fresh[field] for t in trace), f"field {field} never leaves its initial value"
    path = tmp_path / "extras.pt"
    for cut in range(len(pattern) + 1):
        first = DynamicLossScaler(**config)
        resumed = [(run_step(first, overflow), *dynamic_state(first)) for overflow in pattern[:cut]]
        state = first.state_dict()
        assert plain(state)
        torch.save({"precision": {"scaler": state}}, path)
        loaded = torch.load(path, weights_only=True)["precision"]["scaler"]
        assert loaded == state

        second = DynamicLossScaler(**config)
        second.load_state_dict(loaded)
        assert dynamic_state(second) == dynamic_state(first)
        resumed += [(run_step(second, overflow), *dynamic_state(second)) for overflow in pattern[cut:]]
        assert resumed == trace, f"resuming after step {cut} changed the run"


def test_load_state_dict_fits_the_new_configuration_and_rejects_garbage():
    saved = DynamicLossScaler(initial_scale_power=10, hysteresis=3)
    for overflow in (True, True, True, True):  # budget 3 -> 2 -> 1, then two halvings: 2**10 -> 2**8
        run_step(saved, overflow)
    state = saved.state_dict()
    assert state["scale"] == 2.0**8 and state["cur_hysteresis"] == 1 and state["skipped_steps"] == 4

    # A static run keeps its fixed scale; the counters carry over.
    static = DynamicLossScaler(static_loss_scale=64.0)
    static.load_state_dict(state)
    assert static.scale == 64.0 and static.skipped_steps == 4
    # A raised floor and a smaller budget clamp the restored values.
    clamped = DynamicLossScaler(initial_scale_power=12, hysteresis=1, min_loss_scale=2.0**9)
    clamped.load_state_dict({**state, "cur_hysteresis": 3})
    assert clamped.scale == 2.0**9 and clamped.cur_hysteresis == 1

    for broken in ({k: v for k, v in state.items() if k != "scale"}, {**state, "scale": INF},
                   {**state, "skipped_steps": -1}, {**state, "growth_tracker": 1.5}, {**state, "version": 99}):
        with pytest.raises(ValueError):
            DynamicLossScaler().load_state_dict(broken)


# ----- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option,value",
    [("initial_scale_power", -1), ("initial_scale_power", 127), ("initial_scale_power", 16.0),
     ("initial_scale_power", True), ("initial_scale_power", "16"),
     ("loss_scale_window", 0), ("loss_scale_window", -3), ("loss_scale_window", 2.5),
     ("hysteresis", 0), ("hysteresis", 1.5), ("hysteresis", None),
     ("min_loss_scale", 0), ("min_loss_scale", -1.0), ("min_loss_scale", INF), ("min_loss_scale", NAN),
     ("min_loss_scale", 2.0**17), ("min_loss_scale", "1"),
     ("static_loss_scale", 0), ("static_loss_scale", -2.0), ("static_loss_scale", INF),
     ("static_loss_scale", NAN), ("static_loss_scale", True), ("static_loss_scale", 2.0**127),
     ("consecutive_hysteresis", "yes"), ("consecutive_hysteresis", 1)],
)
def test_bad_values_raise_naming_the_option(option, value):
    with pytest.raises(ValueError, match=re.escape(f"precision.{option} ")) as info:
        DynamicLossScaler(**{option: value})
    message = str(info.value)
    assert repr(value) in message
    if option != "consecutive_hysteresis":  # the allowed range is spelled out
        assert re.search(r"\[|>=|null", message)


def test_valid_edges_are_accepted():
    DynamicLossScaler(initial_scale_power=0, min_loss_scale=1)
    DynamicLossScaler(initial_scale_power=126, loss_scale_window=1, hysteresis=1, min_loss_scale=2.0**-126)
    DynamicLossScaler(static_loss_scale=2.0**126)
    assert math.isclose(DynamicLossScaler(static_loss_scale=3).scale, 3.0)
