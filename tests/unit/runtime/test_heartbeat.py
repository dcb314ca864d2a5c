"""The heartbeat's bookkeeping, on an in-memory store and in one process: who is silent, for how long,
and when a watcher reports (its report, which ends the process, is recorded instead)."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from trainer.runtime import heartbeat
from trainer.runtime.heartbeat import LEFT, Heartbeat, Staleness, interval_for


def test_staleness_counts_from_the_last_change_and_forgets_ranks_that_left():
    staleness = Staleness([0, 1, 2], started=100.0)
    staleness.observe(0, 5, now=101.0)
    staleness.observe(0, 5, now=104.0)  # no change: still silent since 101
    staleness.observe(1, 7, now=103.5)
    staleness.observe(2, LEFT + 3, now=102.0)
    assert staleness.silent_for(0, 106.0) == pytest.approx(5.0)
    assert staleness.silent_for(1, 106.0) == pytest.approx(2.5)
    assert staleness.silent_for(2, 106.0) == 0.0
    assert staleness.silent(106.0, limit=2.0) == [(0, pytest.approx(5.0)), (1, pytest.approx(2.5))]
    staleness.restart(106.0)
    assert staleness.silent(107.0, limit=0.5) == [(0, pytest.approx(1.0)), (1, pytest.approx(1.0))]


def test_interval_is_a_tenth_of_the_silence_within_bounds():
    assert interval_for(10.0) == pytest.approx(1.0)
    assert interval_for(0.5) == pytest.approx(0.2)
    assert interval_for(1800.0) == pytest.approx(5.0)


class Recording(Heartbeat):
    """A heartbeat whose report is recorded instead of ending the process."""

    def _report(self, what, kill_peer, exit):
        self.reports = [*getattr(self, "reports", []), what]
        self._stopping.set()


class Freezable(Heartbeat):
    """A heartbeat that can be frozen: its thread stops where it is, as in a stopped process."""

    frozen = False

    def _sleep(self, thread):
        while self.frozen:
            time.sleep(0.05)
        return super()._sleep(thread)


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_watcher_names_the_rank_that_stopped_beating_and_not_one_that_beats():
    store = dist.HashStore()
    watcher = Recording(lambda: store, rank=0, world_size=2, silence_s=0.6, watch=True).start()
    beating = Freezable(lambda: store, rank=1, world_size=2, silence_s=0.6, watch=False).start()
    time.sleep(1.2)  # twice the silence: a beating rank is never reported
    assert not getattr(watcher, "reports", []), watcher.reports
    beating.frozen = True  # it stops beating without leaving, as a stopped process would
    assert _wait_for(lambda: getattr(watcher, "reports", []), 3.0)
    assert watcher.reports[0].startswith("rank 1 stopped responding: no heartbeat for "), watcher.reports
    assert "trainer.collective_timeout_s=0.6" in watcher.reports[0]
    watcher.stop()
    beating.frozen = False
    beating.stop()


def test_a_rank_that_leaves_is_not_reported():
    store = dist.HashStore()
    watcher = Recording(lambda: store, rank=1, world_size=2, silence_s=0.6, watch=True).start()
    leaving = Heartbeat(lambda: store, rank=0, world_size=2, silence_s=0.6, watch=False).start()
    time.sleep(0.3)
    leaving.stop()
    assert int(store.add(heartbeat.counter_key(0), 0)) >= LEFT
    time.sleep(1.2)
    assert not getattr(watcher, "reports", []), watcher.reports
    watcher.stop()


def test_a_shorter_silence_counts_from_when_it_was_set():
    # A peer still beating at the long interval of the first join must not be taken for silent the
    # moment the run sets a shorter collective timeout.
    store = dist.HashStore()
    watcher = Recording(lambda: store, rank=0, world_size=2, silence_s=1800.0, watch=True).start()
    time.sleep(1.0)  # rank 1 has not beaten at all: silent for 1 s
    watcher.set_silence(0.8)
    time.sleep(0.5)  # 1.5 s since the start, 0.5 s since the change
    assert not getattr(watcher, "reports", []), watcher.reports
    assert _wait_for(lambda: getattr(watcher, "reports", []), 3.0)  # and after 0.8 s of the new limit: reported
    watcher.stop()


def test_a_store_that_stops_answering_is_reported():
    class Frozen:
        """A store whose every request blocks (its host is stopped)."""

        def set(self, *args):
            time.sleep(3600)

    watcher = Recording(lambda: Frozen(), rank=1, world_size=2, silence_s=0.6, watch=True,
                        store_name="the job's store at h:1 (on rank 0)").start()
    assert _wait_for(lambda: getattr(watcher, "reports", []), 3.0)
    assert watcher.reports[0].startswith("the job's store at h:1 (on rank 0) did not answer for "), watcher.reports
