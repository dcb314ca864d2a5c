"""bench/_pipeline_trace.py on traces made here from known call durations, hop and local work: the replay
rebuilds the step, the hop measurement finds the hop, and equal calls with nothing between them give
the schedule's formula."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                     "bench")
sys.path.insert(0, BENCH)

from _pipeline_trace import decompose, hop_latencies, replay  # noqa: E402

M = 4


def gpipe_orders() -> list[list[tuple]]:
    return [[("F", rank, i) for i in range(M)] + [("B", rank, i) for i in range(M)] for rank in range(2)]


def one_f_one_b_orders() -> list[list[tuple]]:
    first = [("F", 0, 0), ("F", 0, 1)]
    last = [("F", 1, 0)]
    for i in range(M):
        first += [("B", 0, i)] + ([("F", 0, i + 2)] if i + 2 < M else [])
        last += [("B", 1, i)] + ([("F", 1, i + 1)] if i + 1 < M else [])
    return [first, last]


def simulate(orders, duration, hop: float, local: float) -> list[dict]:
    """One step's trace: each rank runs its calls in order, each after its rank's local work and, for a
    call reading another stage's output, ``hop`` after that output's call ended; a wait spans the rest."""
    ends, free, position = {}, [0.0, 0.0], [0, 0]
    events = [[], []]
    while any(position[r] < len(orders[r]) for r in range(2)):
        for rank in range(2):
            while position[rank] < len(orders[rank]):
                kind, stage, chunk = key = orders[rank][position[rank]]
                source = ("F", stage - 1, chunk) if kind == "F" and stage > 0 else (
                    ("B", stage + 1, chunk) if kind == "B" and stage < 1 else None)
                if source is not None and source not in ends:
                    break
                ready = free[rank] + local
                events[rank].append(["post", -1, -1, ready - local / 2, ready])  # half the local work posts messages
                start = max(ready, ends[source] + hop) if source else ready
                if start > ready:
                    events[rank].append(["wait", -1, -1, ready, start])
                ends[key] = start + duration(key)
                events[rank].append([kind, stage, chunk, start, ends[key]])
                free[rank], position[rank] = ends[key], position[rank] + 1
    return [{"start": 0.0, "end": free[rank], "events": events[rank]} for rank in range(2)]


def measured_idle(step: list[dict]) -> list[float]:
    window = max(r["end"] for r in step) - max(r["start"] for r in step)
    return [1 - sum(e[4] - e[3] for e in r["events"] if e[0] in "FBW") / window for r in step]


def test_equal_calls_with_nothing_between_give_the_formula():
    step = simulate(gpipe_orders(), lambda key: 1.0, hop=0.0, local=0.0)
    assert replay([step]) == pytest.approx([1 / (M + 1)] * 2)  # (p-1)/(m+p-1)
    assert measured_idle(step) == pytest.approx([1 / (M + 1)] * 2)
    assert replay([step], mean_calls=True, local_work="none") == pytest.approx([1 / (M + 1)] * 2)


@pytest.mark.parametrize("orders", [gpipe_orders, one_f_one_b_orders])
def test_the_replay_with_the_measured_hop_rebuilds_the_step_and_splits_its_idle_time(orders):
    # Uneven calls: the first stage slower, backward twice the forward, one slow call.
    def duration(key):
        kind, stage, chunk = key
        return (1.0 if kind == "F" else 2.0) * (1.3 if stage == 0 else 1.0) * (1.5 if key == ("B", 1, 2) else 1.0)

    steps = [simulate(orders(), duration, hop=0.25, local=0.05) for _ in range(2)]
    hops = hop_latencies(steps)
    assert hops and hops == pytest.approx([0.25] * len(hops))
    measured = measured_idle(steps[0])
    assert replay(steps, hop_s=0.25) == pytest.approx(measured)
    without_hop, mean_calls = replay(steps), replay(steps, mean_calls=True, local_work="none")
    assert all(a < b for a, b in zip(without_hop, measured))
    split = decompose(steps)
    assert split["hop_ms"] == pytest.approx(250.0)
    assert split["replay_with_hop"] == pytest.approx(sum(measured) / 2)
    assert split["replay_mean_calls"] == pytest.approx(sum(mean_calls) / 2)
    assert split["replay_measured_calls"] < split["replay_with_local_work"] < split["replay_with_posting"]
    assert split["replay_with_posting"] < split["replay_with_hop"]
    assert split["posting_ms_per_step"] == pytest.approx(1e3 * 2 * M * 0.025)
    with pytest.raises(ValueError, match="local_work='some'"):
        replay(steps, local_work="some")
