"""Where a pipeline step's idle time goes: replay the schedule's measured calls through its data dependencies.

bench/pipeline_bubble.py records, per rank and step, every stage compute call (``F`` forward, ``B``
backward (input gradient, or the whole backward), ``W`` deferred weight gradient) with its stage index,
micro-batch and start / end, and every wait on the point-to-point sends and receives. The ranks share
one clock (``time.perf_counter`` is CLOCK_MONOTONIC on Linux), so the calls of all ranks line up.

A call waits for the calls whose output it reads: ``F(s, i)`` for ``F(s-1, i)`` (the activations),
``B(s, i)`` for ``B(s+1, i)`` (the gradient); on its own rank it also follows the call before it, plus
the rank's own work between the two that is not waiting (the schedule's Python, the loss, posting
messages). :func:`replay` rebuilds the step from those rules alone, adding one measured cost at a time:

- the calls at their rank's mean duration per kind, nothing between them: the schedule's bubble with
  these stages (their imbalance included; the formula assumes equal stages);
- the calls as measured: their variation (a slot lasts as long as the slower of the calls that meet in it);
- the ranks' work between calls, first without posting the messages (the schedule's Python, the loss),
  then with it (the time ``isend`` / ``irecv`` take to return);
- the message hop added to each dependency that crosses ranks;

and whatever the last replay still misses is waiting the dependencies do not explain.
:func:`hop_latencies` measures the hop: from the producing call's end to the end of the consumer's
wait, over the waits that were already under way when the producer finished (so the figure is the
whole delivery: the producer posting its send, gloo's transfer, the consumer's thread waking up).
"""

from __future__ import annotations

from statistics import median

COMPUTE = ("F", "B", "W")


def _producer(kind: str, stage: int, chunk: int, last_stage: int) -> tuple | None:
    """The call whose output ``(kind, stage, chunk)`` reads from another stage, if any."""
    if kind == "F" and stage > 0:
        return ("F", stage - 1, chunk)
    if kind == "B" and stage < last_stage:
        return ("B", stage + 1, chunk)
    return None


def _calls(step: list[dict]) -> tuple[list[dict], int]:
    """Every compute call of one step with its rank, duration, local work and last wait before it.

    ``step``: per rank ``{"start", "end", "events": [[kind, stage, chunk, start, end], ...]}`` with
    ``kind`` one of ``F B W wait post`` (a wait's or post's stage and chunk are -1; posting a message is
    the rank's own work, not waiting).
    """
    calls, last_stage = [], 0
    for rank, record in enumerate(step):
        events = sorted(record["events"], key=lambda e: e[3])
        waits = [e for e in events if e[0] == "wait"]
        cursor = record["start"]
        posts = [e for e in events if e[0] == "post"]

        def gap(begin: float, end: float, key: tuple, last_wait) -> dict:
            waited = sum(w[4] - w[3] for w in waits if w[3] >= begin and w[4] <= end)
            posting = sum(p[4] - p[3] for p in posts if p[3] >= begin and p[4] <= end)
            local = max(0.0, end - begin - waited)
            return {"rank": rank, "key": key, "local": local, "posting": min(posting, local), "last_wait": last_wait}

        for kind, stage, chunk, start, end in (e for e in events if e[0] in COMPUTE):
            before = [w for w in waits if w[3] >= cursor and w[4] <= start]
            calls.append({**gap(cursor, start, (kind, stage, chunk), before[-1] if before else None),
                          "start": start, "end": end})
            cursor = end
            last_stage = max(last_stage, stage)
        calls.append({**gap(cursor, record["end"], ("tail", -1, -1), None),
                      "start": record["end"], "end": record["end"]})
    return sorted(calls, key=lambda c: c["start"]), last_stage


def hop_latencies(steps: list[list[dict]]) -> list[float]:
    """Seconds from a producing call's end to the end of the consumer's wait on another rank, for each
    wait that had begun before the producer ended."""
    hops = []
    for step in steps:
        calls, last_stage = _calls(step)
        by_key = {c["key"]: c for c in calls}
        for call in calls:
            source = _producer(*call["key"], last_stage) if call["key"][0] in COMPUTE else None
            producer, wait = by_key.get(source), call["last_wait"]
            if producer is None or producer["rank"] == call["rank"] or wait is None:
                continue
            if wait[3] <= producer["end"] <= wait[4]:
                hops.append(wait[4] - producer["end"])
    return hops


def replay(steps: list[list[dict]], hop_s: float = 0.0, mean_calls: bool = False,
           local_work: str = "all") -> list[float]:
    """Per rank, the idle fraction of the steps rebuilt from the dependencies alone (see the module's text).

    ``hop_s``: the cost added to every dependency that crosses ranks. ``mean_calls``: every call lasts
    the mean of its rank's calls of the same kind (the stages' imbalance stays, the variation goes).
    ``local_work``: the rank's measured work between calls that is kept: ``all``, ``no posting`` (all
    but posting the messages) or ``none`` (calls follow each other at once).
    """
    if local_work not in ("all", "no posting", "none"):
        raise ValueError(f"local_work={local_work!r} is not one of all, no posting, none")
    ranks = len(steps[0])
    busy, window = [0.0] * ranks, 0.0
    for step in steps:
        calls, last_stage = _calls(step)
        durations: dict[tuple, list[float]] = {}
        for c in calls:
            durations.setdefault((c["rank"], c["key"][0]), []).append(c["end"] - c["start"])
        means = {key: sum(values) / len(values) for key, values in durations.items()}
        free, ends = [0.0] * ranks, {}
        for c in calls:  # in order of their measured start: a dependency always started earlier
            kind = c["key"][0]
            length = means[(c["rank"], kind)] if mean_calls else c["end"] - c["start"]
            local = {"all": c["local"], "no posting": c["local"] - c["posting"], "none": 0.0}[local_work]
            start = free[c["rank"]] + local
            source = _producer(*c["key"], last_stage) if kind in COMPUTE else None
            if source in ends:
                producer_rank, producer_end = ends[source]
                start = max(start, producer_end + (hop_s if producer_rank != c["rank"] else 0.0))
            ends[c["key"]] = (c["rank"], start + length)
            free[c["rank"]] = start + length
            if kind in COMPUTE:
                busy[c["rank"]] += length
        window += max(free)
    return [1 - b / window for b in busy]


def decompose(steps: list[list[dict]]) -> dict:
    """The replays one beside the other, each adding one measured cost to the one before (mean idle
    fractions over the ranks), with the measured hop, the median compute call and the posting time."""
    hops = hop_latencies(steps)
    hop = median(hops) if hops else 0.0

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    calls = [c for step in steps for c in _calls(step)[0]]
    return {"replay_mean_calls": mean(replay(steps, mean_calls=True, local_work="none")),
            "replay_measured_calls": mean(replay(steps, local_work="none")),
            "replay_with_local_work": mean(replay(steps, local_work="no posting")),
            "replay_with_posting": mean(replay(steps)),
            "replay_with_hop": mean(replay(steps, hop_s=hop)),
            "hop_ms": 1e3 * hop, "hops": len(hops),
            "call_ms": 1e3 * median(c["end"] - c["start"] for c in calls if c["key"][0] in COMPUTE),
            "posting_ms_per_step": 1e3 * sum(c["posting"] for c in calls) / len(steps) / len(steps[0])}
