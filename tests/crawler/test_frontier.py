"""The frontier on real stores: admission, dedup, claiming, commit order, reopening."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

import kvstore
from crawler.state import pendscan
from crawler.state.frontier import Claimed, Frontier, Outcome
from crawler.state.pages import PageRecord, Pending, decode_page, encode_page
from crawler.web.urls import url_key


def u(i: int) -> str:
    return f"http://h0.test/p{i}.html"


def link(i: int, depth: int = 1) -> tuple[bytes, Pending]:
    return url_key(u(i)), Pending(u(i), depth)


def page(c: Claimed) -> bytes:
    return encode_page(
        PageRecord(url=c.entry.url, status=200, fetched_at=1.0, depth=c.entry.depth, body=b"x")
    )


def claim_all(f: Frontier) -> list[Claimed]:
    out = []
    while (bulk := f.claim()) is not None:
        out.extend(bulk)
    return out


def test_seeds_are_admitted_once(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), bulk_size=3)
    f.add_seeds([Pending(u(1)), Pending(u(2)), Pending(u(1))])
    f.commit()
    f.add_seeds([Pending(u(2))])
    f.commit()
    claimed = claim_all(f)
    assert sorted(c.entry.url for c in claimed) == [u(1), u(2)]
    assert (tmp_path / "urls.log").read_text().splitlines() == [u(1), u(2)]
    f.close()


def test_links_are_deduplicated_against_every_set(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), bulk_size=2)
    f.add_seeds([Pending(u(0)), Pending(u(1))])
    f.commit()
    claimed = claim_all(f)  # u0, u1 in flight
    c0 = next(c for c in claimed if c.entry.url == u(0))
    # u0 links to itself (done now), u1 (in flight), u2 twice (new), u3 (new)
    f.submit(Outcome(c0, page(c0), links=[link(0), link(1), link(2), link(2), link(3)]))
    f.commit()
    assert f.counts()["admitted"] == 4  # the two seeds, u2, u3
    c1 = next(c for c in claimed if c.entry.url == u(1))
    f.submit(Outcome(c1, page(c1), links=[link(2), link(3), link(0)]))  # pending, pending, done
    f.commit()
    assert f.counts()["admitted"] == 4
    assert sorted(c.entry.url for c in claim_all(f)) == [u(2), u(3)]
    f.close()


def test_a_bulk_is_tombstoned_only_when_every_url_is_committed(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), bulk_size=3)
    f.add_seeds([Pending(u(i)) for i in range(3)])
    f.commit()
    bulk = f.claim()
    assert bulk is not None and len(bulk) == 3
    assert len(f.pend) == 1
    f.submit(Outcome(bulk[0], page(bulk[0])))
    f.submit(Outcome(bulk[1], None, requeue=Pending(bulk[1].entry.url, attempts=1)))
    f.commit()
    assert bulk[0].bulk in f.pend  # one URL still in flight
    f.submit(Outcome(bulk[2], page(bulk[2])))
    f.commit()
    assert bulk[0].bulk not in f.pend
    again = claim_all(f)
    assert [(c.entry.url, c.entry.attempts) for c in again] == [(bulk[1].entry.url, 1)]
    f.submit(Outcome(again[0], page(again[0])))
    f.commit()
    assert f.idle()
    assert decode_page(f.main[bulk[0].key]).body == b"x"
    f.close()


def test_reopen_brings_back_unfinished_bulks_and_skips_done_urls(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), bulk_size=4)
    f.add_seeds([Pending(u(i)) for i in range(4)])
    f.commit()
    bulk = f.claim()
    assert bulk is not None
    f.submit(Outcome(bulk[0], page(bulk[0]), links=[link(9)]))
    f.commit()
    f.close()  # bulk[1:] were claimed but never finished: like a crash or a stop
    f = Frontier(str(tmp_path), bulk_size=4)
    assert not f.idle()
    urls = sorted(c.entry.url for c in claim_all(f))
    assert urls == sorted([bulk[1].entry.url, bulk[2].entry.url, bulk[3].entry.url, u(9)])
    f.close()


@pytest.mark.parametrize("batch", [1, 5, pendscan.REBUILD_BATCH])
def test_reopen_rebuilds_pending_urls_exactly_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """The open rebuilds PendSet a batch of URLs at a time (bounded memory at 27M
    pending URLs): every not-done URL of every live bulk, and no done one, whatever
    the batch's size against the bulks'."""
    f = Frontier(str(tmp_path), bulk_size=4)
    f.add_seeds([Pending(u(i)) for i in range(41)])
    f.commit()
    claimed = claim_all(f)
    done = claimed[::3]
    for c in done:
        f.submit(Outcome(c, page(c)))
    f.commit()
    f.close()
    monkeypatch.setattr(pendscan, "REBUILD_BATCH", batch)
    g = Frontier(str(tmp_path), bulk_size=4)
    done_keys = {url_key(c.entry.url) for c in done}
    want = {url_key(c.entry.url) for c in claimed} - done_keys
    assert len(claimed) == 41 and len(want) == 27
    assert g.counts()["pending"] == len(g.pend_set) == len(want)
    assert all(k in g.pend_set for k in want)
    assert not any(k in g.pend_set for k in done_keys)
    g.close()


def mapped_files(under: Path) -> list[str]:
    """The files under ``under`` that this process maps (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[5] for line in f if len(line.split()) >= 6}
    return sorted(p for p in paths if p.startswith(str(under)))


def test_an_open_and_its_claims_map_nothing_of_the_stores(tmp_path: Path) -> None:
    """The open reads every PendDB bulk, claims read more, expand reads done pages:
    all by pread, so none of the store files' pages stays in the shard's RSS (through
    a map, PendDB's alone was ~0.65 GB a shard at 20M pages)."""
    f = Frontier(str(tmp_path), bulk_size=4)
    f.add_seeds([Pending(u(i)) for i in range(200)])
    f.commit()
    c = f.claim()
    assert c is not None
    f.submit(Outcome(c[0], page(c[0])))
    f.commit()
    f.close()
    g = Frontier(str(tmp_path), bulk_size=4)
    assert g.counts()["pending"] == 199
    claimed = claim_all(g)
    assert len(claimed) == 199
    assert decode_page(g.main[url_key(c[0].entry.url)]).url == c[0].entry.url
    assert mapped_files(tmp_path) == []
    g.close()


def test_idle_only_when_nothing_is_pending_or_claimed(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path))
    assert f.idle()
    f.add_seeds([Pending(u(1))])
    assert not f.idle()
    f.commit()
    assert not f.idle()
    bulk = f.claim()
    assert bulk is not None and not f.idle()
    f.submit(Outcome(bulk[0], page(bulk[0])))
    assert not f.idle()
    f.commit()
    assert f.idle()
    f.close()


class _Watched:
    """A frontier's unclaimed-bulk set that asks ``idle()`` as each commit's new bulks
    arrive: the last moment of the window in which they are not claimable yet."""

    def __init__(self, inner: object, frontier: Frontier, seen: list[bool]) -> None:
        self.inner, self.frontier, self.seen = inner, frontier, seen

    def add_many(self, keys: object) -> None:
        self.seen.append(self.frontier.idle())
        self.inner.add_many(keys)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __contains__(self, key: object) -> bool:
        return key in self.inner  # type: ignore[operator]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_never_idle_while_a_commit_holds_seeds_or_links(tmp_path: Path) -> None:
    """Between a commit taking its batch and its bulks being claimable, the engine asks
    idle() from another thread at any moment: a True there ended crawls "complete" with
    the seed never fetched, or a page's links never claimed (its claim already gone)."""
    f = Frontier(str(tmp_path))
    seen: list[bool] = []
    f._claims.unclaimed = _Watched(f._claims.unclaimed, f, seen)  # type: ignore[assignment]
    f.add_seeds([Pending(u(1))])
    f.commit()  # the seed
    bulk = f.claim()
    assert bulk is not None
    f.submit(Outcome(bulk[0], page(bulk[0]), links=[link(2), link(3)]))
    f.commit()  # the page and its links: its claim ends before the links' bulk arrives
    assert seen == [False, False]
    assert not f.idle() and len(claim_all(f)) == 2
    f.close()


def test_admission_is_exact_whatever_the_recent_keys_cache_holds(tmp_path: Path) -> None:
    """A tiny cache rotates generations every few keys: each URL is still admitted once,
    against the stores, across commits, claims and completions (a random workload)."""
    rng = random.Random(7)
    f = Frontier(str(tmp_path), bulk_size=5, recent_keys=3)
    f.add_seeds([Pending(u(0))])
    f.commit()
    offered: set[int] = {0}
    fetched: list[str] = []
    while (bulk := f.claim()) is not None or not f.idle():
        for c in bulk or []:
            targets = [rng.randrange(300) for _ in range(rng.randrange(0, 12))]
            offered.update(targets)
            f.submit(Outcome(c, page(c), links=[link(i) for i in targets]))
            fetched.append(c.entry.url)
        f.commit()
    assert sorted(fetched) == sorted(u(i) for i in offered)  # each offered URL exactly once
    assert f.counts()["admitted"] == len(offered)
    assert (tmp_path / "urls.log").read_text().count("\n") == len(offered)
    f.close()


def _submitter(f: Frontier, outcome: Outcome) -> threading.Thread:
    t = threading.Thread(target=f.submit, args=(outcome,), daemon=True)
    t.start()
    return t


def test_submit_waits_while_max_queued_outcomes_are_unwritten(tmp_path: Path) -> None:
    """A committer that lags holds the workers back: past ``max_queued`` unwritten
    outcomes a submit waits for the next commit (a kill then loses little)."""
    f = Frontier(str(tmp_path), bulk_size=4, max_queued=2)
    f.add_seeds([Pending(u(i)) for i in range(4)])
    f.commit()
    claimed = claim_all(f)
    f.submit(Outcome(claimed[0], page(claimed[0])))
    f.submit(Outcome(claimed[1], page(claimed[1])))
    third = _submitter(f, Outcome(claimed[2], page(claimed[2])))
    third.join(0.3)  # the one wait that must time out: nothing would end it but a commit
    assert third.is_alive(), "a third unwritten outcome was queued past max_queued=2"
    assert f.commit() == 2
    third.join(10)
    assert not third.is_alive()
    f.submit(Outcome(claimed[3], page(claimed[3])))  # room for one more beside the third
    assert f.commit() == 2 and f.idle()
    f.close()


def test_a_failed_commit_leaves_no_submitter_waiting(tmp_path: Path) -> None:
    f = Frontier(str(tmp_path), bulk_size=2, max_queued=1)
    f.add_seeds([Pending(u(0)), Pending(u(1))])
    f.commit()
    claimed = claim_all(f)
    f.submit(Outcome(claimed[0], page(claimed[0])))
    second = _submitter(f, Outcome(claimed[1], page(claimed[1])))
    f.main.close()  # the next write fails, as on a broken disk
    with pytest.raises(kvstore.exceptions.KVStoreError):
        f.commit()
    second.join(10)
    assert not second.is_alive(), "a submitter still waits for a committer that failed"
    f.close()  # abandons the stores: nothing more is written


def _blocking_fsync(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """os.fsync that waits to be released: a disk that takes its time."""
    real = os.fsync
    entered, release = threading.Event(), threading.Event()

    def fsync(fd: int) -> None:
        entered.set()
        assert release.wait(10), "the test never released the fsync"
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return entered, release


def test_commits_go_on_while_the_periodic_fsync_waits_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync every sync_interval must not stall the committer: pages answered
    meanwhile would sit unwritten, and a kill -9 would refetch them all."""
    f = Frontier(str(tmp_path), bulk_size=4, sync_interval=3600.0)
    f.add_seeds([Pending(u(i)) for i in range(4)])
    f.commit()
    claimed = claim_all(f)
    f.sync_interval = 0.0  # the first periodic fsync is the blocking one
    entered, release = _blocking_fsync(monkeypatch)
    try:
        f.submit(Outcome(claimed[0], page(claimed[0])))
        f.commit()  # due: the periodic fsync starts, and blocks
        assert entered.wait(10), "no periodic fsync ran"
        committing = threading.Thread(
            target=lambda: [(f.submit(Outcome(c, page(c))), f.commit()) for c in claimed[1:]],
            daemon=True,
        )
        committing.start()
        committing.join(5)
        assert not committing.is_alive(), "a commit waited for the periodic fsync"
        with kvstore.open(tmp_path / "main", readonly=True) as main:  # what a restart sees
            assert len(main) == 4
    finally:
        release.set()
    monkeypatch.undo()
    f.close()


def test_a_failed_periodic_fsync_fails_the_next_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = Frontier(str(tmp_path), bulk_size=2, sync_interval=3600.0)
    f.add_seeds([Pending(u(0)), Pending(u(1))])
    f.commit()
    claimed = claim_all(f)
    f.sync_interval = 0.0  # from now on: no fsync ran before the broken one is in place

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    f.submit(Outcome(claimed[0], page(claimed[0])))
    f.commit()  # starts the fsync that fails on the syncer thread
    f.syncer.thread.join(10)  # type: ignore[union-attr]
    f.submit(Outcome(claimed[1], page(claimed[1])))
    with pytest.raises(OSError, match="Input/output"):
        f.commit()
    monkeypatch.undo()
    f.close()  # abandons the stores, as after any failed commit
    with kvstore.open(tmp_path / "main") as main:
        assert decode_page(main[claimed[0].key]).url == claimed[0].entry.url


def test_pending_counts_only_urls_not_done_after_a_restart(tmp_path: Path) -> None:
    """A bulk stays live until its last URL is done: after a restart, the URLs of it
    done before are neither pending nor claimed, and a finished crawl has 0 pending."""
    f = Frontier(str(tmp_path), bulk_size=3)
    f.add_seeds([Pending(u(i)) for i in range(3)])
    f.commit()
    claimed = claim_all(f)
    f.submit(Outcome(claimed[0], page(claimed[0])))
    f.commit()
    f.close()  # two of the bulk's URLs unfinished: the bulk stays live
    g = Frontier(str(tmp_path), bulk_size=3)
    assert g.counts()["pending"] == 2
    again = claim_all(g)
    assert sorted(c.entry.url for c in again) == sorted(c.entry.url for c in claimed[1:])
    for c in again:
        g.submit(Outcome(c, page(c)))
    g.commit()
    assert g.idle() and g.counts() == {**g.counts(), "pending": 0, "in_flight": 0, "done": 3}
    g.close()


def test_a_released_url_stays_in_its_bulk_and_is_claimed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """release() writes nothing: the bulk stays live (a kill loses nothing), is not
    claimable while cooling, then gives back only the URLs still to do."""
    import crawler.state.frontier as frontier_mod

    monkeypatch.setattr(frontier_mod, "RELEASE_COOLDOWN", 0.0)
    f = Frontier(str(tmp_path), bulk_size=3)
    f.add_seeds([Pending(u(i)) for i in range(3)])
    f.commit()
    claimed = claim_all(f)
    val = next((tmp_path / "pend").glob("data-*.val"))
    val_size = val.stat().st_size
    f.release(claimed[1])
    assert f.counts()["pending"] == 1 and f.counts()["in_flight"] == 2
    for c in (claimed[0], claimed[2]):
        f.submit(Outcome(c, page(c)))
    f.commit()
    assert not f.idle() and len(f.pend) == 1  # live, not tombstoned
    again = claim_all(f)
    assert [c.entry.url for c in again] == [claimed[1].entry.url]
    f.submit(Outcome(again[0], page(again[0])))
    f.commit()
    f.commit()  # the tombstone of the finished bulk
    assert f.idle() and len(f.pend) == 0 and len(f.main) == 3
    f.close()
    # No bulk was written for the release: VAL grew by the finished bulk's deletion only.
    assert val.stat().st_size == val_size + 24


def test_pend_db_is_compacted_once_most_of_it_is_dead(tmp_path: Path) -> None:
    """Claimed and finished bulks leave dead bytes in PendDB; the syncer compacts it, and
    the bulks still live stay claimable, here and after a reopen."""
    f = Frontier(str(tmp_path), bulk_size=5, sync_interval=0.0, compact_bytes=4096)
    f.add_seeds([Pending(u(i)) for i in range(2000)])
    f.commit()
    before = f.pend.stats()
    claimed = []
    while len(claimed) < 1900 and (bulk := f.claim()) is not None:
        claimed.extend(bulk)
    for c in claimed:
        f.submit(Outcome(c, page(c)))
    f.commit()
    f.commit()  # the tombstones are written: the syncer sees the dead bytes now
    deadline = time.monotonic() + 30
    while f.compactions == 0:
        assert time.monotonic() < deadline, "PendDB was not compacted"
        f.commit()
        time.sleep(0.05)
    after = f.pend.stats()
    assert after.generation > before.generation and after.dead_bytes < before.live_bytes // 4
    left = {c.entry.url for c in claim_all(f)}
    assert left == {u(i) for i in range(2000)} - {c.entry.url for c in claimed}
    f.close()
    again = Frontier(str(tmp_path), bulk_size=5)
    assert again.counts()["pending"] == 2000 - len(claimed) and len(again.main) == len(claimed)
    again.close()


def test_a_link_to_a_url_being_released_is_not_admitted_again(tmp_path: Path) -> None:
    """A worker's release moves a URL from ProcessingSet back to PendSet while the
    committer asks whether a link is known. Asked one set after the other, the link could
    fall between them: admitted a second time (a second bulk), counted pending twice, so
    status's counters stayed one above ``status --recount`` after the crawl ended (seen
    in CI). The two are asked together, under the lock a claim and a release take."""
    f = Frontier(str(tmp_path), bulk_size=2)
    f.add_seeds([Pending(u(0)), Pending(u(1))])
    f.commit()
    f.close()
    f = Frontier(str(tmp_path), bulk_size=2)  # admission's cache of recent keys is empty
    claimed = claim_all(f)
    c0, c1 = sorted(claimed, key=lambda c: c.entry.url)
    asked = f.pend_set.contains_many
    releasers: list[threading.Thread] = []

    def then_released(keys: object) -> object:
        found = asked(keys)  # u1 is in ProcessingSet still: not here
        if not releasers:  # the release, when it can run at once, before the next ask
            releasers.append(threading.Thread(target=f.release, args=(c1,)))
            releasers[0].start()
            releasers[0].join(0.5)
        return found

    f.pend_set.contains_many = then_released  # type: ignore[method-assign]
    f.submit(Outcome(c0, page(c0), links=[link(1)]))
    f.commit()
    assert releasers
    releasers[0].join()
    del f.pend_set.contains_many
    assert f.counts()["admitted"] == 0
    assert f.tally.tally is not None and f.tally.tally.pending == 1  # u1 alone
    assert len(f.pend) == 1  # u1's first bulk, no second one
    f.close()
