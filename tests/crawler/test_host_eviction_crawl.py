"""Crawls of the test web on loopback with a scheduler that keeps 5 host slots for 30 hosts:
hosts are evicted and come back all the time, and the crawl is the oracle's all the same,
--max-pages-per-host is exact, Crawl-delay holds, and no robots.txt or sitemap is asked twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import META_PATHS, fetched_urls, host_name, records, run_crawl

from crawler.run import politeness
from tools.testweb import TestWeb, fault
from tools.testweb.graph import SiteConfig

HOSTS, SLOTS, CRAWL_DELAY, LIMIT = 30, 5, 0.1, 6


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    site = SiteConfig(hosts=HOSTS, pages=12 * HOSTS, seed=17, crawl_delay=CRAWL_DELAY)
    w = TestWeb(site, faults=[fault("sitemaps")]).start()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture
def few_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine makes its Scheduler with the default bound: 5 slots for 30 hosts.
    monkeypatch.setattr(politeness, "DEFAULT_MAX_SLOTS", SLOTS)


def test_a_crawl_with_few_slots_matches_the_oracle_and_stays_polite(
    web: TestWeb, tmp_path: Path, few_slots: None
) -> None:
    web.log.clear()
    want = web.oracle.crawl()
    engine = run_crawl(web, tmp_path / "c", threads=8, per_host=1)
    assert engine.complete  # type: ignore[attr-defined]
    s = engine.scheduler
    assert s.max_slots == SLOTS and s.evictions >= HOSTS, "hosts were evicted, and came back"
    assert s.hosts() == len(web.log.hosts()) == HOSTS  # each host counted once
    got = fetched_urls(tmp_path / "c")
    assert got == set(want.fetched), (sorted(got - want.fetched)[:3],
                                      sorted(want.fetched - got)[:3])
    assert web.log.urls() == set(want.requests)
    # A sitemap fetch that failed transiently is tried again (--max-retries, SITEMAPS.md):
    # on a starved machine the decompression bomb's can time out. Only those repeat.
    repeats = web.log.duplicates()
    assert all("/sitemaps/" in url for url in repeats), repeats
    assert sum(n - 1 for n in repeats.values()) <= engine.sitemaps.counts["sitemap_retry"]
    asked = Counter((r.host, r.path) for r in web.log.records() if r.path in META_PATHS)
    for host in web.log.hosts():
        assert asked[host, "/robots.txt"] == 1, host
        assert asked[host, "/sitemap.xml"] == 1, host
    assert engine.sitemaps is not None and engine.sitemaps.walks() == 0
    delayed = [h for h in web.log.hosts() if want.crawl_delay.get(h)]
    assert delayed, "some hosts ask for a Crawl-delay"
    for host in web.log.hosts():
        assert web.log.max_concurrency(host) <= 1
        delay = want.crawl_delay.get(host, 0.0)
        gaps = web.log.gaps(host)
        assert all(g >= delay - 0.01 for g in gaps), (host, min(gaps), delay)


def test_max_pages_per_host_stays_exact_across_evictions(
    web: TestWeb, tmp_path: Path, few_slots: None
) -> None:
    web.log.clear()
    engine = run_crawl(web, tmp_path / "c", threads=8, per_host=1, max_pages_per_host=LIMIT)
    assert engine.complete  # type: ignore[attr-defined]
    assert engine.scheduler.evictions >= HOSTS
    sitemaps = web.oracle.crawl().sitemaps  # sitemap files are not pages: never limited
    pages = Counter(r.host for r in web.log.records() if r.path not in META_PATHS
                    and r.url not in sitemaps)
    cut = {host_name(u) for u, r in records(tmp_path / "c").items()
           if r.reason == "host_page_limit"}
    assert len(cut) >= HOSTS // 2, "most hosts reach the limit"
    assert max(pages.values()) <= LIMIT, pages.most_common(3)
    assert {h: pages[h] for h in cut} == dict.fromkeys(cut, LIMIT)
    assert not web.log.duplicates()
