"""The frontier's syncer thread (crawler.state.syncer): a stop that has to wait for the
upkeep under way (a compaction: 74-95 s a shard at 20M pages) says so at once."""

from __future__ import annotations

import logging
import threading

import pytest

from crawler.state import syncer
from crawler.state.syncer import Syncer


def test_a_stop_that_waits_for_a_long_upkeep_says_what_it_waits_for(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncer, "STOP_QUIET", 0.05)
    inside, release = threading.Event(), threading.Event()
    synced: list[int] = []

    def upkeep() -> None:  # stands for a compaction: runs until released
        inside.set()
        release.wait(30)

    s = Syncer(0.0, lambda: synced.append(1), upkeep, "crawl/shard-00")
    s.maybe()  # due at once: the thread syncs, then runs the upkeep
    assert inside.wait(10)
    stopper = threading.Thread(target=s.stop)
    with caplog.at_level(logging.WARNING, logger=syncer.__name__):
        stopper.start()
        for _ in range(200):  # the warning comes while the upkeep still runs
            if caplog.records:
                break
            stopper.join(0.05)
        assert stopper.is_alive()  # waiting for the upkeep, as it must
        assert [r.getMessage() for r in caplog.records] == [
            "crawl/shard-00: waiting for the fsync or compaction under way to end (a second "
            "Ctrl-C stops at once, as safely as a kill -9)"]
        release.set()
        stopper.join(10)
    assert not stopper.is_alive() and s.thread is None and synced == [1]


def test_a_stop_with_nothing_under_way_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    synced: list[int] = []
    upkept = threading.Event()
    s = Syncer(0.0, lambda: synced.append(1), upkept.set)
    s.maybe()
    assert upkept.wait(10)  # the thread synced, kept up, and waits for the next turn
    with caplog.at_level(logging.WARNING, logger=syncer.__name__):
        s.stop()
    assert caplog.records == [] and s.thread is None and synced == [1]
