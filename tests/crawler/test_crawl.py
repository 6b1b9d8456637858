"""End-to-end crawls of the test web: completeness against the oracle, politeness, DNS, HTTPS."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import fetched_urls, host_name, record, records, run_crawl

from crawler.web.urls import host_key
from tools.testweb import TestWeb, fault

MakeWeb = Callable[..., TestWeb]


def robots_urls(web: TestWeb) -> set[str]:
    return {u for u in web.log.urls() if u.endswith("/robots.txt")}


@pytest.mark.slow
def test_full_crawl_matches_the_oracle_and_fetches_each_page_once(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=2000, hosts=20, seed=3, crawl_delay=0.05)
    want = web.oracle.crawl()
    engine = run_crawl(web, tmp_path / "crawl", threads=32, per_host=4)
    assert engine.complete
    got = fetched_urls(tmp_path / "crawl")
    assert got == set(want.fetched), (
        sorted(got - set(want.fetched))[:5],
        sorted(set(want.fetched) - got)[:5],
    )
    assert web.log.urls() == set(want.requests)
    assert not web.log.duplicates()
    # Every outcome is recorded: robots-blocked URLs too, so nothing is tried twice.
    recs = records(tmp_path / "crawl")
    assert {u for u, r in recs.items() if r.reason == "robots_disallowed"} == set(want.blocked)


def test_resume_after_completion_fetches_nothing(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=60, hosts=3, seed=0, crawl_delay=0.0)
    first = run_crawl(web, tmp_path / "c")
    assert first.complete
    n = len(web.log.records())
    assert n > 0
    again = run_crawl(web, tmp_path / "c")
    assert again.complete
    pages_after = [r for r in web.log.records()[n:] if not r.target.endswith("/robots.txt")]
    assert pages_after == []


def test_politeness_per_host_limit_and_delay(make_testweb: MakeWeb, tmp_path: Path) -> None:
    # 60 pages: every gap of every host is checked, and each host has dozens (120 pages
    # took ~9 s of delays and proved the same rule on more gaps).
    web = make_testweb(pages=60, hosts=3, seed=5, crawl_delay=0.15)
    engine = run_crawl(web, tmp_path / "c", threads=16, per_host=1, delay=0.05)
    assert engine.complete
    want = web.oracle.crawl()
    for host in web.log.hosts():
        assert web.log.max_concurrency(host) <= 1
        gaps = web.log.gaps(host)
        delay = max(0.05, want.crawl_delay.get(host, 0.0))
        assert all(g >= delay - 0.01 for g in gaps), (host, min(gaps), delay)


def test_retry_after_is_honoured(make_testweb: MakeWeb, tmp_path: Path) -> None:
    # 15 pages, 4 of them in /s1/: each 429 holds the host 1 s, and more of them (30
    # pages: ~8 s) only repeated the same check.
    web = make_testweb(
        pages=15,
        hosts=1,
        seed=2,
        faults=[fault("status_429", host="h0.test", prefix="/s1/", retry_after=1)],
    )
    engine = run_crawl(web, tmp_path / "c", threads=4, per_host=1)
    assert engine.complete
    assert fetched_urls(tmp_path / "c") == set(web.oracle.crawl().fetched)
    log = sorted(web.log.records(host="h0.test"), key=lambda r: r.start)
    assert sum(r.status == 429 for r in log[:-1]) >= 2, "the crawl met 429s with a request after"
    for before, after in zip(log, log[1:], strict=False):
        if before.status == 429:
            assert after.start - before.end >= 1.0 - 0.02, (before.target, after.target)


# The slow host's slow pages (two, so the test stays short) and how slow they are; a
# gap longer than STALL in the other hosts' requests is a stall. STALL is scheduling
# noise on a loaded machine (other test runs share its two cores), well below SLOW.
SLOW_PREFIX, SLOW, STALL = "/s3/", 3.0, 1.0


def test_slow_host_does_not_stall_the_others(make_testweb: MakeWeb, tmp_path: Path) -> None:
    slow = fault("slow_first_byte", host="h1.test", prefix=SLOW_PREFIX, delay=SLOW)
    web = make_testweb(pages=100, hosts=4, seed=4, crawl_delay=0.0, faults=[slow])
    want = web.oracle.crawl()
    # Every URL is a seed: the other hosts have work from the start to their last
    # request, so a gap in their requests is the crawler's doing, not a link not found yet.
    engine = run_crawl(
        web,
        tmp_path / "c",
        seeds=sorted(want.fetched),
        threads=16,
        per_host=2,
        total_timeout=5.0,
        read_timeout=5.0,
    )
    assert engine.complete
    assert fetched_urls(tmp_path / "c") == set(want.fetched)
    slow_reqs = [r for r in web.log.records(host="h1.test") if r.path.startswith(SLOW_PREFIX)]
    assert slow_reqs and all(r.end - r.start >= SLOW - 0.05 for r in slow_reqs)
    others = sorted(
        (r for h in ("h0.test", "h2.test", "h3.test") for r in web.log.records(host=h)),
        key=lambda r: r.start,
    )
    # The others were crawled while h1 was slow (else the test shows nothing)...
    slow_from, slow_to = min(r.start for r in slow_reqs), max(r.end for r in slow_reqs)
    assert sum(slow_from < r.start < slow_to for r in others) >= 5
    # ... back to back: the longest wait between two of their requests is short.
    waits = [b.start - a.end for a, b in itertools.pairwise(others)]
    assert max(waits) <= STALL, sorted(waits)[-5:]
    assert max(r.end for r in others) < slow_to


def test_each_host_is_resolved_once_and_dead_hosts_are_bad_hosts(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    # Dead hosts of their own (one URL each) and dead site hosts (many URLs each).
    faults = [fault("nxdomain"), fault("refused")]
    faults += [fault("nxdomain", host="h2.test"), fault("refused", host="h1.test")]
    web = make_testweb(pages=80, hosts=4, seed=6, crawl_delay=0.0, faults=faults)
    per_host = 2
    engine = run_crawl(web, tmp_path / "c", per_host=per_host)
    assert engine.complete
    dead = ("nx.test", "refused.test", "h2.test", "h1.test")
    assert web.dns is not None
    for host in web.log.hosts() | set(dead):
        assert len(web.dns.queries(host)) == 1, host  # dead or alive, one lookup
    assert not {r.host for r in web.log.records()} & set(dead)
    recs = records(tmp_path / "c")
    for host, reason in zip(dead, ("dns_nxdomain", "connect_refused") * 2, strict=True):
        reasons = [r.reason for u, r in recs.items() if host_name(u) == host]
        # The first URLs (as many as run at once on a host) meet the failure, the rest
        # are recorded from BadHosts without touching the network.
        assert 1 <= reasons.count(reason) <= per_host, (host, reasons)
        assert set(reasons) <= {reason, "bad_host:" + reason}, (host, reasons)
        if host.startswith("h"):
            assert len(reasons) > 3, (host, "a dead site host has many URLs")
    import kvstore

    with kvstore.open(tmp_path / "c" / "badhosts", readonly=True) as bad:
        assert all(host_key(h) in bad for h in dead)


def test_https_through_the_resolved_ip_with_sni(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=60, hosts=2, seed=7, crawl_delay=0.0)  # h1.test is HTTPS
    engine = run_crawl(web, tmp_path / "c")
    assert engine.complete
    https = web.log.records(host="h1.test")
    assert https and all(r.scheme == "https" and r.sni == "h1.test" for r in https)
    assert fetched_urls(tmp_path / "c") == set(web.oracle.crawl().fetched)


def test_private_ip_is_refused_by_default(testweb: TestWeb, tmp_path: Path) -> None:
    engine = run_crawl(testweb, tmp_path / "c", allow_private_ips=False)
    assert engine.complete
    assert testweb.log.records() == []
    recs = records(tmp_path / "c")
    assert [r.reason for r in recs.values()] == ["private_ip"]


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_site_that_compresses_is_crawled_as_the_oracle_says(
    make_testweb: MakeWeb, tmp_path: Path, coding: str
) -> None:
    """A site answering its pages in ``coding`` (as nginx's gzip and brotli filters do):
    the crawl is the oracle's, and each stored body is the page as the site has it."""
    web = make_testweb(pages=60, hosts=3, seed=4, crawl_delay=0.0, encodings=(coding,))
    want = web.oracle.crawl()
    assert run_crawl(web, tmp_path / "c").complete
    assert fetched_urls(tmp_path / "c") == set(want.fetched)
    pages = [r for r in web.log.records() if r.status == 200 and r.path != "/robots.txt"]
    assert pages and {r.encoding for r in pages} == {coding}
    with web.session() as s:
        s.headers["Accept-Encoding"] = "identity"
        for r in pages:
            plain = s.get(r.url, allow_redirects=False, timeout=10)
            assert plain.headers.get("Content-Encoding") is None
            assert record(tmp_path / "c", r.url).body == plain.content, r.url


def test_the_counts_asked_after_the_stores_closed_are_the_last_ones(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """A shard's supervisor asks for a report whenever it likes, also while the shard
    closes its stores (a SIGTERM as shards start): the answer is the counts at the close,
    not an error in a thread."""
    web = make_testweb(pages=30, hosts=2, seed=1, crawl_delay=0.0)
    engine = run_crawl(web, tmp_path / "c")
    assert engine.complete
    counts = engine.status_counts()  # the stores are closed now
    assert counts["fetched"] == engine.counters.snapshot().fetched > 0
    assert counts["pending"] == 0 and counts["done"] == len(records(tmp_path / "c"))
