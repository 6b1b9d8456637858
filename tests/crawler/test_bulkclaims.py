"""The frontier's claim bookkeeping alone (crawler.state.bulkclaims), on a clock the test
moves: a bulk claimed once, finished only when every URL of it was committed, cooling
after a release, and idle only when no bulk is anywhere."""

from __future__ import annotations

import numpy as np

from crawler.state.bulkclaims import BulkClaims
from crawler.state.pages import bulk_key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def keys(*counters: int) -> np.ndarray:
    return np.frombuffer(b"".join(bulk_key(c) for c in counters),
                         dtype=np.uint8).reshape(-1, 16)


def held(claims: BulkClaims, counter: int, urls: int) -> bytes:
    """A new bulk added, taken and holding ``urls`` URLs: its key."""
    claims.add(keys(counter))
    bk = claims.take()
    assert bk == bulk_key(counter)
    claims.hold(bk, urls)
    return bk


def test_each_bulk_is_taken_once_and_finished_when_its_last_url_is_committed() -> None:
    claims = BulkClaims(0.5, Clock())
    assert claims.idle() and claims.take() is None
    claims.add(keys(1, 2))
    assert len(claims) == 2 and not claims.idle()
    taken = {claims.take(), claims.take()}
    assert taken == {bulk_key(1), bulk_key(2)} and claims.take() is None
    claims.hold(bulk_key(1), 3)
    claims.hold(bulk_key(2), 1)
    assert [claims.commit(bulk_key(1)) for _ in range(3)] == [False, False, True]
    assert not claims.idle()  # bulk 2 is still claimed
    assert claims.commit(bulk_key(2)) is True
    assert claims.idle() and claims.take_finished() == []  # the commit tombstones them


def test_a_bulk_with_nothing_to_hand_out_is_finished_for_the_next_commit() -> None:
    claims = BulkClaims(0.5, Clock())
    claims.add(keys(7))
    bk = claims.take()
    assert bk == bulk_key(7)
    claims.hold(bk, 0)
    assert not claims.idle()  # its tombstone is not written yet
    assert claims.take_finished() == [bk] and claims.take_finished() == []
    assert claims.idle()


def test_a_released_url_keeps_its_bulk_live_and_claimable_after_the_cooldown() -> None:
    clock = Clock()
    claims = BulkClaims(0.5, clock)
    bk = held(claims, 3, 3)
    claims.release(bk)
    assert claims.commit(bk) is False
    assert claims.commit(bk) is False  # the last, but a URL of it is still to do: cooling
    assert not claims.idle() and claims.take() is None and claims.take_finished() == []
    clock.now += 0.49
    assert claims.take() is None
    clock.now += 0.01
    assert claims.take() == bk  # claimable again: the released URL is handed out
    claims.hold(bk, 1)
    assert claims.commit(bk) is True  # this time every URL was committed
    assert claims.idle()


def test_a_bulk_whose_urls_were_all_released_cools_and_comes_back() -> None:
    clock = Clock()
    claims = BulkClaims(0.5, clock)
    bk = held(claims, 4, 2)
    claims.release(bk)
    assert claims.take() is None and not claims.idle()
    claims.release(bk)
    assert not claims.idle() and claims.take() is None
    clock.now += 0.5
    assert claims.take() == bk
