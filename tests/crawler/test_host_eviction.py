"""Per-host state stays bounded: the scheduler evicts idle host slots (keeping the counters
that must survive), and a sitemap walk keeps its state only while it is under way."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import config_for

from crawler.exceptions import DNSError
from crawler.net.dnscache import DNSCache
from crawler.run import politeness
from crawler.run.engine import Engine
from crawler.run.politeness import HostSlot, Scheduler
from crawler.run.sitemaps import MAX_SITEMAPS_PER_HOST, SitemapTask
from crawler.state.sitemapstore import SitemapStore
from crawler.web.urls import parse
from tools.testweb import TestWeb, fault
from tools.testweb.dnsserver import DNSServer
from tools.testweb.graph import SiteConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock, **kw: Any) -> Scheduler:
    settings: dict[str, Any] = dict(
        per_host=1, delay=0.0, max_waiting=1000, max_waiting_per_host=100, max_slots=5
    )
    settings.update(kw)
    return Scheduler(clock=clock, **settings)


def visit(s: Scheduler, host: str, *, contacted: bool = True) -> HostSlot:
    """One URL of ``host`` offered, taken and done with; the slot it was served on."""
    assert s.offer(host, host)
    got = s.next(timeout=0)
    assert got is not None and got[1] == host
    s.release(got[0], contacted=contacted)
    return got[0]


def churn(s: Scheduler, n: int, tag: str = "other") -> None:
    """``n`` new hosts visited once each: enough to evict every idle slot."""
    for i in range(n):
        visit(s, f"{tag}{i}.test", contacted=False)


class TestSchedulerEviction:
    def test_idle_slots_are_evicted_past_the_bound_and_hosts_still_counts_them(self) -> None:
        s = make(Clock())
        churn(s, 200)
        assert s.slots() <= s.max_slots + 1
        assert s.evictions >= 190
        assert s.hosts() == 200  # hosts seen this run, evicted ones included
        churn(s, 200)  # the same hosts again: none counted twice
        assert s.hosts() == 200

    def test_default_bound_is_read_when_the_scheduler_is_made(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(politeness, "DEFAULT_MAX_SLOTS", 3)
        s = Scheduler(per_host=1, delay=0.0, max_waiting=10, max_waiting_per_host=10)
        assert s.max_slots == 3
        assert Scheduler(per_host=1, delay=0.0, max_waiting=10, max_waiting_per_host=10,
                         max_slots=7).max_slots == 7

    def test_fetches_survive_eviction_so_the_page_limit_stays_exact(self) -> None:
        s = make(Clock())
        a = visit(s, "a.test")
        for _ in range(3):
            assert s.reserve_fetch(a, 3)
        assert not s.reserve_fetch(a, 3)
        churn(s, 50)
        again = visit(s, "a.test")
        assert again is not a, "the slot was evicted and made anew"
        assert again.fetches == 3
        assert not s.reserve_fetch(again, 3)

    def test_failure_counts_survive_eviction_so_the_backoff_keeps_doubling(self) -> None:
        s = make(Clock())
        a = visit(s, "a.test", contacted=False)
        assert s.host_failed(a, 1.0, 100.0) == 1.0
        assert s.host_failed(a, 1.0, 100.0) == 2.0
        assert s.robots_outcome(a, True) == 1
        assert s.robots_outcome(a, True) == 2
        churn(s, 50)
        again = visit(s, "a.test", contacted=False)
        assert again is not a
        assert s.host_failed(again, 1.0, 100.0) == 4.0
        assert s.robots_outcome(again, True) == 3
        s.host_ok(again)
        assert s.robots_outcome(again, False) == 0
        churn(s, 50, "third")
        last = visit(s, "a.test", contacted=False)
        assert last is not again
        assert s.host_failed(last, 1.0, 100.0) == 1.0  # host_ok was kept too
        assert s.robots_outcome(last, True) == 1

    def test_a_host_in_its_delay_is_never_evicted(self) -> None:
        clock = Clock()
        s = make(clock, delay=10.0)
        a = visit(s, "a.test")  # contacted: not before now + 10
        churn(s, 50)
        assert s.slot("a.test") is a, "evicted while its delay ran"
        assert s.offer("a.test", "again")
        clock.now += 9.9
        assert s.next(timeout=0) is None  # politeness holds across the churn
        clock.now += 0.2
        got = s.next(timeout=0)
        assert got is not None and got[1] == "again"
        s.release(got[0], contacted=False, not_before=clock.now + 60)  # a Retry-After
        clock.now += 30
        churn(s, 50, "third")
        assert s.slot("a.test") is a
        clock.now += 31
        churn(s, 50, "fourth")
        assert s.slot("a.test") is not a  # its time passed: now it may go

    def test_hosts_with_waiting_or_active_urls_are_never_evicted(self) -> None:
        s = make(Clock(), per_host=1)
        visit(s, "busy.test", contacted=False)  # idle once: listed for eviction
        for i in range(3):
            assert s.offer("busy.test", i)
        got = s.next(timeout=0)
        assert got is not None and got[1] == 0  # one active, two waiting
        churn(s, 50)
        assert s.slot("busy.test") is got[0]
        s.release(got[0], contacted=False)
        left = []
        while (nxt := s.next(timeout=0)) is not None:
            left.append(nxt[1])
            s.release(nxt[0], contacted=False)
        assert left == [1, 2]

    def test_a_refused_offer_makes_no_slot(self) -> None:
        s = make(Clock(), max_waiting=1)
        assert s.offer("a.test", 1)
        assert not s.offer("b.test", 1)
        assert s.hosts() == 1

    def test_the_wait_list_is_allocated_only_while_urls_wait(self) -> None:
        s = make(Clock(), per_host=2)
        a = visit(s, "a.test")
        assert a.queue is None
        s.offer("a.test", 1)
        s.offer("a.test", 2)
        assert a.queue is not None and len(a.queue) == 2
        s.next(timeout=0)
        s.next(timeout=0)
        assert a.queue is None
        s.offer("a.test", 3)
        assert s.drain() == [3] and a.queue is None

    def test_each_new_slot_examines_a_bounded_number_of_idle_slots(self) -> None:
        """Eviction is amortized: with 2,000 idle slots that may not go yet (their delay
        runs), a new host looks at a few of them, not all."""
        clock = Clock()
        s = make(clock, delay=10.0, max_slots=5)
        for i in range(2000):
            visit(s, f"wait{i}.test")
        assert s.slots() == 2000  # none may go: every one is in its delay
        before = list(s._idle)
        s.offer("new.test", 1)
        after = list(s._idle)
        step = politeness._SWEEP
        assert step < 50
        assert after == before[step:] + before[:step]


# -- sitemap walks -------------------------------------------------------------------------


@pytest.fixture
def sitemap_web() -> Iterator[TestWeb]:
    web = TestWeb(SiteConfig(hosts=3, pages=30, seed=11), faults=[fault("sitemaps")]).start()
    try:
        yield web
    finally:
        web.stop()


@contextlib.contextmanager
def committing(engine: Engine) -> Iterator[None]:
    """The engine's committer thread, as in a crawl (a sitemap's URLs wait for it)."""
    t = threading.Thread(target=engine._commit_loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        engine._workers_done.set()
        t.join()


def close_engine(engine: Engine) -> None:
    for fetcher in (engine.fetcher, engine.robots_fetcher):
        fetcher.close()
    assert engine.sitemaps is not None
    engine.sitemaps.close()
    engine.bad_hosts.close()
    engine.robots_store.close()
    engine.frontier.close()


def serve_all(engine: Engine) -> int:
    """Serve every queued sitemap task on this thread; how many were served."""
    n = 0
    while (got := engine.scheduler.next(timeout=0.5)) is not None:
        slot, task = got
        assert isinstance(task, SitemapTask)
        task.serve(slot)
        n += 1
    return n


def test_a_walk_holds_state_only_while_its_sitemaps_are_read(
    sitemap_web: TestWeb, tmp_path: Path
) -> None:
    web = sitemap_web
    engine = Engine(config_for(web, tmp_path / "c", sitemaps="all"))
    try:
        sm = engine.sitemaps
        assert sm is not None
        home = parse(web.site.url("h0.test", "/"))
        # As the engine does: robots.txt first (its Sitemap lines), then discovery.
        engine.robots_gate.check(engine.scheduler.slot(home.host), home)
        sm.discover(home)
        assert sm.walks() == 1, "its /sitemap.xml waits: the walk is under way"
        with committing(engine):
            assert serve_all(engine) >= 2
        assert sm.walks() == 0, "nothing of the origin waits: the walk has ended"
        # Every sitemap of the origin was read (none dropped by a walk ended too early).
        want = {u for u in web.oracle.crawl().sitemaps if parse(u).host == "h0.test"}
        got = {r["url"] for r in sm.store.records()}
        assert want <= got, sorted(want - got)[:3]
        n = len(web.log.records())
        # Discovered again (any page of the origin): nothing is queued, nothing fetched.
        sm.discover(parse(web.site.url("h0.test", "/p/1.html")))
        assert engine.scheduler.waiting == 0 and sm.walks() == 0
        assert len(web.log.records()) == n
    finally:
        close_engine(engine)


def test_an_ended_walk_is_not_walked_again(sitemap_web: TestWeb, tmp_path: Path) -> None:
    """An origin whose sitemaps a run already walked is not walked again from the store:
    its budget would start over (here: a recorded index with more children than the
    budget, so each walk counts the children it drops)."""
    web = sitemap_web
    data = tmp_path / "c"
    origin = parse(web.site.url("h1.test", "/")).robots_key
    children = [f"{origin}/c{i}.xml" for i in range(MAX_SITEMAPS_PER_HOST + 20)]
    data.mkdir()
    store = SitemapStore(str(data))
    base = {"status": 404, "reason": "", "fetched_at": 1.0, "level": 1, "kind": "",
            "error": "", "redirect": "", "urls": [], "children": [], "admitted": 0,
            "off_origin": 0, "dropped": 0}
    store.put({**base, "url": f"{origin}/sitemap.xml", "status": 200, "kind": "index",
               "level": 0, "children": children})
    for url in children:
        store.put({**base, "url": url})
    store.close()
    engine = Engine(config_for(web, data, sitemaps="all", obey_robots=False))
    try:
        sm = engine.sitemaps
        assert sm is not None
        sm.discover(parse(web.site.url("h1.test", "/")))
        dropped = sm.snapshot().get("sitemap_budget", 0)
        assert dropped == 21  # /sitemap.xml and 63 children read, 21 over the budget
        assert engine.scheduler.waiting == 0 and sm.walks() == 0
        sm.discover(parse(web.site.url("h1.test", "/p/2.html")))
        assert sm.snapshot().get("sitemap_budget", 0) == dropped
        assert web.log.records() == []
    finally:
        close_engine(engine)


# -- the DNS cache ---------------------------------------------------------------------------


def test_the_dns_cache_is_bounded_even_when_every_entry_is_live() -> None:
    """Past max_entries the names that expire soonest go (after the expired ones), so
    a crawl meeting many hosts within the TTL does not grow the cache without end."""
    names = {f"n{i}.test": f"127.0.2.{i}" for i in range(60)}
    with DNSServer(names, ttl=3600) as server:
        cache = DNSCache([server.address], allow_private_ips=True, max_entries=8)
        sizes = []
        for name in names:
            cache.resolve(name)
            with pytest.raises(DNSError):
                cache.resolve("no-" + name)  # a negative entry each
            sizes.append(cache.stats().entries)
        assert max(sizes) <= 8 + 1
        assert min(sizes[8:]) >= 8 * 3 // 4 - 1  # a purge keeps 3/4 of the bound
