"""The hostile web: every fault of tools/testweb's catalog meets its designed outcome.

Each group of faults is crawled once (a module fixture) on a small site with
short limits; the tests then read the crawl's MainDB records, its status.json,
its BadHosts and the test web's request and DNS logs. The designed outcomes
are tabled in docs/HOSTILE.md. Durations are asserted only as bounds that the
crawler's own settings guarantee (a retry starts at least one backoff after
the failure ended), never as a measure of speed.
"""

from __future__ import annotations

import email.utils
import http.server
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import (
    META_PATHS,
    Answer,
    Hit,
    LocalServer,
    bad_hosts,
    host_name,
    html_links,
    record,
    records,
    run_crawl,
    status_json,
    tries,
)

from crawler.run.engine import Engine
from crawler.run.politeness import Scheduler
from crawler.state.pages import PageRecord
from crawler.web.robots import DEFAULT_MAX_ROBOTS_BYTES, robots_key
from tools.testweb import CrawlResult, SiteConfig, TestWeb, fault

MakeWeb = Callable[..., TestWeb]
KIB = 1024
MIB = 1024 * KIB

# Short limits, so every fault plays out in seconds.
LIMITS: dict[str, Any] = dict(
    threads=8,
    per_host=1,  # one connection per host: the log shows the host's backoff exactly
    connect_timeout=1.0,
    read_timeout=2.0,  # above the total limit: the total limit is what cuts a slow answer
    total_timeout=1.0,
    dns_timeout=0.6,
    backoff=0.2,
    max_retries=2,
    max_retry_after=2.0,
    max_body_bytes=256 * KIB,
    max_decoded_bytes=512 * KIB,
    max_redirects=10,
    max_url_length=2048,
)
TRIES = 1 + LIMITS["max_retries"]
EPS = 0.02  # clock granularity between the server's log and the crawler's timers
# Upper bounds: what the crawler's own limit allows, plus this. The machine is shared
# (two cores, other test runs beside this one): a thread can be kept off the CPU for a
# good part of a second, so the slack is about scheduling, not about the crawler.
SLACK = 1.5


@dataclass
class Crawl:
    web: TestWeb
    data: Path
    engine: Engine
    want: CrawlResult
    recs: dict[str, PageRecord]
    marks: dict[str, float] = field(default_factory=dict)  # times the test noted

    def url(self, host: str, target: str) -> str:
        return self.web.url(host, target)

    def answered(self) -> set[str]:
        """URLs recorded with an HTTP answer."""
        return {u for u, r in self.recs.items() if r.status > 0}


def crawl(web: TestWeb, data: Path, oracle: dict[str, Any] | None = None, **over: Any) -> Crawl:
    settings = {**LIMITS, **over}
    engine = run_crawl(web, data, **settings)
    assert engine.complete  # type: ignore[attr-defined]
    limits = dict(max_url_length=settings["max_url_length"], **(oracle or {}))
    if "max_redirects" in over:
        limits["max_redirects"] = over["max_redirects"]
    return Crawl(web, data, engine, web.oracle.crawl(**limits), records(data))


@pytest.fixture(scope="module")
def webs() -> Iterator[Callable[..., TestWeb]]:
    started: list[TestWeb] = []

    def start(config: SiteConfig, faults: list[Any]) -> TestWeb:
        web = TestWeb(config, faults=faults).start()
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()


def gaps(reqs: list[Any]) -> list[float]:
    """Seconds from the end of each try to the start of the next."""
    return [b.start - a.end for a, b in zip(reqs, reqs[1:], strict=False)]


def next_on_host(web: TestWeb, req: Any) -> Any:
    """The first request to ``req``'s host that started after ``req`` (None if none)."""
    later = [r for r in web.log.records(host=req.host) if r.start > req.start]
    return min(later, key=lambda r: r.start, default=None)


def assert_host_backed_off(web: TestWeb, reqs: list[Any]) -> None:
    """After each failed try the whole host (not just the URL) waited at least a backoff."""
    for req in reqs:
        nxt = next_on_host(web, req)
        if nxt is None and req is reqs[-1]:
            continue  # nothing else was left to fetch on the host
        assert nxt is not None and nxt.start - req.end >= LIMITS["backoff"] - EPS, req.target


# -- response faults -----------------------------------------------------------------------

# An HTTP-date a few seconds ahead: the crawl meets this 429 well before it.
RETRY_DATE_AHEAD = 3.5
RETRY_CAP = 4.0  # max_retry_after for these crawls: above what the date asks for


@pytest.fixture(scope="module")
def responses(webs: Callable[..., TestWeb], tmp_path_factory: pytest.TempPathFactory) -> Crawl:
    date = email.utils.formatdate(time.time() + RETRY_DATE_AHEAD, usegmt=True)
    faults = [
        fault("slow_first_byte", delay=0.3),
        fault("slow_first_byte", host="h1.test", delay=3.0),
        fault("slow_drip"),  # 200 bytes, one every 50 ms: 10 s, far past the total limit
        fault("reset"),
        fault("huge_body", size=8 * MIB),
        fault("huge_body", host="h1.test", size=8 * MIB, chunked=True),
        fault("gzip_bomb", size=16 * MIB),
        fault("status_429", retry_after=1),
        fault("status_429", host="h2.test", retry_after=date),
        fault("status_503", retry_after=1, times=-1),
        fault("status_500"),
        fault("wrong_type"),
    ]
    web = webs(SiteConfig(pages=30, hosts=3, seed=1, crawl_delay=0.0), faults)
    c = crawl(web, tmp_path_factory.mktemp("responses") / "c", max_retry_after=RETRY_CAP)
    c.marks["date"] = email.utils.parsedate_to_datetime(date).timestamp()
    return c


# URL -> (reason, wire status) of the response faults whose designed outcome is a failure
# although the oracle (which assumes a crawler that waits for ever) counts an answer.
RESPONSE_FAILURES = {
    ("h0.test", "/x/slow_drip/1"): "total_timeout",
    ("h0.test", "/x/reset/1"): "reset",
    ("h1.test", "/x/slow_first_byte/1"): "total_timeout",
}
# URL -> requests made: 1 + retries; every other URL is requested exactly once.
RESPONSE_TRIES = {
    ("h0.test", "/x/slow_drip/1"): TRIES,
    ("h0.test", "/x/reset/1"): TRIES,
    ("h1.test", "/x/slow_first_byte/1"): TRIES,
    ("h0.test", "/x/status_503/1"): TRIES,
    ("h0.test", "/x/status_500/1"): TRIES,
    ("h0.test", "/x/status_429/1"): 2,
    ("h2.test", "/x/status_429/1"): 2,
}


@pytest.mark.slow
def test_response_faults_end_as_designed_and_nothing_else_is_lost(responses: Crawl) -> None:
    c = responses
    failed = {c.url(h, t): reason for (h, t), reason in RESPONSE_FAILURES.items()}
    assert c.answered() | set(failed) == set(c.want.fetched)
    for url in c.want.fetched:
        rec = c.recs[url]
        if url in failed:
            assert (rec.status, rec.reason) == (0, failed[url]), url
        else:
            assert rec.status == c.want.status[url], url
    assert c.web.log.urls() == set(c.want.requests)
    want_tries = {c.url(h, t): n for (h, t), n in RESPONSE_TRIES.items()}
    counts = c.web.log.counts()
    assert {u: n for u, n in counts.items() if n > 1} == want_tries


def test_slow_first_byte_within_the_total_limit_is_waited_for(responses: Crawl) -> None:
    url = responses.url("h0.test", "/x/slow_first_byte/1")
    assert responses.recs[url].status == 200 and responses.recs[url].reason == ""
    (req,) = tries(responses.web, url)
    assert req.end - req.start >= 0.3 - EPS  # the server really made it wait
    # ... and the crawler took the answer when it came, not at some later timeout.
    assert responses.recs[url].fetched_at - req.start <= 0.3 + SLACK


def test_slow_first_byte_past_the_total_limit_is_cut_retried_then_recorded(
    responses: Crawl,
) -> None:
    url = responses.url("h1.test", "/x/slow_first_byte/1")
    reqs = tries(responses.web, url)
    assert len(reqs) == TRIES
    # The server logs each try as ending after its delay; the crawler had given up at the
    # total limit, then backed the host off.
    limit = LIMITS["total_timeout"] + LIMITS["backoff"]
    assert all(b.start - a.start >= limit - 0.05 for a, b in zip(reqs, reqs[1:], strict=False))
    assert all(b.start < a.end for a, b in zip(reqs, reqs[1:], strict=False))
    rec = responses.recs[url]
    assert rec.reason == "total_timeout"
    # The last try was given up at the total limit (the server still had 2 s to wait).
    assert rec.fetched_at - reqs[-1].start <= LIMITS["total_timeout"] + SLACK


def test_slow_drip_is_cut_by_the_total_limit_and_frees_its_thread(responses: Crawl) -> None:
    web = responses.web
    url = responses.url("h0.test", "/x/slow_drip/1")
    reqs = tries(web, url)
    assert len(reqs) == TRIES
    size, interval = 200, 0.05  # the fault's defaults: the whole drip takes 10 s
    for req in reqs:
        # Cut by the crawler long before the end: each byte came well within the read
        # timeout, so only the total limit can have stopped it.
        assert req.outcome == "aborted" and req.bytes < size // 2, (req.outcome, req.bytes)
        # ... at the total limit: the server logs each byte as it hands it over, so its
        # end is the last byte before the hang-up (one interval later it saw the reset).
        assert req.end is not None
        assert req.end - req.start <= LIMITS["total_timeout"] + SLACK, req.end - req.start
        # The connection (and its thread) was free again long before the drip would end,
        # and the host was backed off before it was contacted again.
        nxt = next_on_host(web, req)
        if nxt is None and req is reqs[-1]:
            continue  # nothing else was left to fetch on the host
        assert nxt is not None and nxt.start < req.start + size * interval
        limit = LIMITS["total_timeout"] + LIMITS["backoff"]
        assert nxt.start - req.start >= limit - 0.05
    rec = responses.recs[url]
    assert (rec.status, rec.reason, rec.body) == (0, "total_timeout", b"")
    assert rec.fetched_at - reqs[-1].start <= LIMITS["total_timeout"] + SLACK


def test_reset_mid_body_is_retried_with_backoff_then_given_up(responses: Crawl) -> None:
    web = responses.web
    url = responses.url("h0.test", "/x/reset/1")
    reqs = tries(web, url)
    assert [r.outcome for r in reqs] == ["reset"] * TRIES
    assert_host_backed_off(web, reqs)
    assert responses.recs[url].reason == "reset"


@pytest.mark.parametrize("host", ["h0.test", "h1.test"], ids=["content-length", "chunked"])
def test_huge_body_is_cut_at_the_wire_limit(responses: Crawl, host: str) -> None:
    url = responses.url(host, "/x/huge_body/1")
    rec = record(responses.data, url)
    assert (rec.status, rec.truncated) == (200, "too_large")
    assert len(rec.body) == LIMITS["max_body_bytes"]
    (req,) = tries(responses.web, url)
    assert req.bytes < 8 * MIB  # the crawler hung up; the server did not send it all


def test_gzip_bomb_is_cut_at_the_decoded_limit(responses: Crawl) -> None:
    rec = record(responses.data, responses.url("h0.test", "/x/gzip_bomb/1"))
    assert (rec.status, rec.truncated) == (200, "decompression_bomb")
    assert rec.body == b" " * LIMITS["max_decoded_bytes"]


def test_429_retry_after_seconds_holds_the_host(responses: Crawl) -> None:
    web = responses.web
    url = responses.url("h0.test", "/x/status_429/1")
    first, second = tries(web, url)
    assert (first.status, second.status) == (429, 200)
    nxt = next_on_host(web, first)
    assert nxt is not None and nxt.start - first.end >= 1.0 - EPS
    assert responses.recs[url].status == 200


def test_429_retry_after_http_date_holds_the_host_until_then(responses: Crawl) -> None:
    web = responses.web
    date = responses.marks["date"]
    url = responses.url("h2.test", "/x/status_429/1")
    first, second = tries(web, url)
    assert (first.status, second.status) == (429, 200)
    assert first.end < date - 1.0, "the crawl reached the 429 too late to test the date"
    assert date - first.end < RETRY_CAP
    nxt = next_on_host(web, first)
    assert nxt is not None and nxt.start >= date - EPS


def test_503_forever_uses_the_retry_budget_then_records_the_status(responses: Crawl) -> None:
    url = responses.url("h0.test", "/x/status_503/1")
    reqs = tries(responses.web, url)
    assert [r.status for r in reqs] == [503] * TRIES
    assert all(g >= 1.0 - EPS for g in gaps(reqs))  # Retry-After: 1
    rec = responses.recs[url]
    assert (rec.status, rec.reason) == (503, "")


def test_500_is_retried_with_backoff_then_recorded(responses: Crawl) -> None:
    web = responses.web
    url = responses.url("h0.test", "/x/status_500/1")
    reqs = tries(web, url)
    assert [r.status for r in reqs] == [500] * TRIES
    assert_host_backed_off(web, reqs)
    assert responses.recs[url].status == 500


def test_wrong_type_is_not_parsed_for_links(responses: Crawl) -> None:
    rec = record(responses.data, responses.url("h0.test", "/x/wrong_type/1"))
    assert (rec.status, rec.reason, rec.outlinks, rec.body) == (200, "not_html", 0, b"")
    assert rec.content_type.startswith("text/plain")
    assert not responses.web.log.records(path="/x/wrong_type/hidden")


def test_status_json_counts_response_faults_by_class(responses: Crawl) -> None:
    snap = status_json(responses.data)
    outcomes, classes = snap["outcomes"], snap["classes"]
    assert outcomes["total_timeout"] == 2 and outcomes["reset"] == 1
    assert outcomes["retry:total_timeout"] == 4 and outcomes["retry:reset"] == 2
    assert outcomes["too_large"] == 2 and outcomes["decompression_bomb"] == 1
    assert outcomes["retry:http_429"] == 2 and outcomes["retry:http_503"] == 2
    assert outcomes["retry:http_500"] == 2 and outcomes["500"] == outcomes["503"] == 1
    assert classes["timeout"] == 2 and classes["broken"] == 1 and classes["truncated"] == 3
    assert classes["http_5xx"] == 2 and classes["not_html"] == 1
    assert classes["retry"] == sum(v for k, v in outcomes.items() if k.startswith("retry:"))
    assert sum(v for k, v in classes.items() if k != "retry") == len(responses.recs)


# -- content and link features -------------------------------------------------------------


@pytest.fixture(scope="module")
def content(webs: Callable[..., TestWeb], tmp_path_factory: pytest.TempPathFactory) -> Crawl:
    kinds = [
        "redirects",
        "binary",
        "charsets",
        "malformed",
        "base_href",
        "link_schemes",
        "long_urls",
        "meta_robots",
        "idn",
    ]
    web = webs(SiteConfig(pages=20, hosts=2, seed=4, crawl_delay=0.0), [fault(k) for k in kinds])
    return crawl(web, tmp_path_factory.mktemp("content") / "c", per_host=2)


def requested(web: TestWeb, prefix: str, host: str = "h0.test") -> set[str]:
    return {r.path[len(prefix) :] for r in web.log.records(host=host) if r.path.startswith(prefix)}


def test_content_features_match_the_oracle_exactly(content: Crawl) -> None:
    c = content
    assert c.answered() == set(c.want.fetched)
    assert {u: r.status for u, r in c.recs.items() if r.status} == dict(c.want.status)
    assert c.web.log.urls() == set(c.want.requests)
    assert not c.web.log.duplicates()
    assert "internal_error" not in c.engine.counters.snapshot().outcomes


def test_redirects_every_hop_is_a_url_of_its_own(content: Crawl) -> None:
    c = content
    m = "/x/redirects/"
    hops = [f"chain/{k}" for k in range(10)]
    for name in ["loop-a", "loop-b", *hops, "to-host", "to-out", "relative", "303", "307", "308"]:
        rec = c.recs[c.url("h0.test", m + name)]
        assert 300 <= rec.status < 400 and rec.redirect, name
    for name in ["chain/end", "rel-target", "target-303", "target-307", "target-308"]:
        assert c.recs[c.url("h0.test", m + name)].status == 200, name
    counts = c.web.log.counts()
    assert counts[c.url("h0.test", m + "loop-a")] == counts[c.url("h0.test", m + "loop-b")] == 1
    # The other hosts reached through a redirect went through robots.txt like any URL.
    out = c.url("out.test", "/")
    assert c.recs[out].status == 200 and c.url("out.test", "/robots.txt") in c.web.log.urls()
    assert c.recs[c.url("h1.test", "/")].status == 200


def test_redirect_hop_limit_and_scope(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=20, hosts=2, seed=4, crawl_delay=0.0, faults=[fault("redirects")])
    c = crawl(
        web,
        tmp_path / "c",
        oracle=dict(scope={"h0.test"}),
        max_redirects=3,
        broad=False,
        scope_hosts=frozenset({"h0.test"}),
        per_host=2,
    )
    m = "/x/redirects/"
    assert c.answered() == set(c.want.fetched)
    last = c.recs[c.url("h0.test", m + "chain/3")]
    assert (last.status, last.reason, last.redirect) == (
        301,
        "redirect_limit",
        c.url("h0.test", m + "chain/4"),
    )
    assert set(c.want.redirect_limit) == {c.url("h0.test", m + "chain/4")}
    assert web.log.hosts() == {"h0.test"}  # to-host and to-out lead out of scope
    assert c.url("h0.test", m + "to-out") in c.recs and c.url("out.test", "/") not in c.recs


def test_binary_content_is_recorded_by_type_and_never_parsed(content: Crawl) -> None:
    m = "/x/binary/"
    for name, ctype in [
        ("image", "image/png"),
        ("pdf", "application/pdf"),
        ("octet", "application/octet-stream"),
    ]:
        rec = record(content.data, content.url("h0.test", m + name))
        assert (rec.status, rec.reason, rec.body, rec.outlinks) == (200, "not_html", b"", 0)
        assert rec.content_type == ctype
    png = record(content.data, content.url("h0.test", m + "png-as-html"))
    assert (png.status, png.reason, png.outlinks) == (200, "", 0)  # declared HTML: parsed
    assert png.body.startswith(b"\x89PNG")


def test_charsets_decode_links_by_header_meta_or_default(content: Crawl) -> None:
    got = requested(content.web, "/x/charsets/")
    targets = {
        "caf%C3%A9",
        "%D0%BF%D1%80%D0%B8%D0%B2%D0%B5%D1%82",
        "%E6%97%A5%E6%9C%AC",
        "se%C3%B1al",
        "none-target",
    }  # café, привет, 日本, señal as UTF-8
    assert got == {"", "header", "meta", "sjis", "conflict", "none"} | targets
    assert all(
        r.status == 200
        for r in content.web.log.records(host="h0.test")
        if r.path.startswith("/x/charsets/")
    )


def test_malformed_and_deeply_nested_html_gives_its_links(content: Crawl) -> None:
    got = requested(content.web, "/x/malformed/")
    assert got == {"", "broken", "deep", "ok-1", "ok-2", "ok-3", "ok-4"}


def test_base_href_is_honoured(content: Crawl) -> None:
    got = requested(content.web, "/x/base_href/")
    assert got == {
        "",
        "rel",
        "abs",
        "dir/a.html",
        "dir/b.html",
        "root.html",
        "up.html",
        "abs/c.html",
    }


def test_link_schemes_are_normalized_or_rejected(content: Crawl) -> None:
    got = requested(content.web, "/x/link_schemes/")
    assert got == {
        "",
        "page",
        "spaces",
        "proto-relative",
        "Upper",
        "frag",
        "dotted",
        "sp%20ace",
        "entity",
    }
    assert content.web.log.hosts() <= {"h0.test", "h1.test", "out.test", "xn--bcher-kva.test"}


def test_long_urls_beyond_the_limit_are_dropped_at_admission(content: Crawl) -> None:
    c = content
    short = c.url("h0.test", "/x/long_urls/a/" + "x" * (2000 - len("/x/long_urls/a/")))
    assert c.recs[short].status == 200
    assert len(c.want.too_long) == 2
    for url in c.want.too_long:
        assert len(url) > LIMITS["max_url_length"] and url not in c.recs
    assert all(len(r.target) <= 2000 for r in c.web.log.records())


def test_meta_robots_nofollow_and_noindex_are_honoured(content: Crawl) -> None:
    c = content
    got = requested(c.web, "/x/meta_robots/")
    assert got == {"", "nofollow", "noindex", "none", "header", "other-bot", "ni-1", "ob-1"}
    for name, noindex in [
        ("noindex", True),
        ("none", True),
        ("nofollow", False),
        ("header", False),
        ("other-bot", False),
    ]:
        rec = record(c.data, c.url("h0.test", "/x/meta_robots/" + name))
        assert rec.noindex is noindex, name
        assert (rec.body == b"") is noindex, name  # noindex: the record stays, the body not
    assert {u for u, r in c.recs.items() if r.noindex} == set(c.want.noindex)


def test_idn_host_is_fetched_by_its_ascii_name(content: Crawl) -> None:
    c = content
    for target in ("/", "/e/1.html"):
        assert c.recs[c.url("xn--bcher-kva.test", target)].status == 200
    assert c.web.dns is not None and c.web.dns.queries("xn--bcher-kva.test")


# -- host faults: DNS, connections, certificates, robots.txt -------------------------------

DNS_SLOW = 0.2
ROBOTS_SLOW_CUT = 3.0  # past the total limit: timed out
ROBOTS_SLOW_OK = 0.3  # within it: waited for
BAD_HOST_RETRY = 600.0


@pytest.fixture(scope="module")
def hosts(webs: Callable[..., TestWeb], tmp_path_factory: pytest.TempPathFactory) -> Crawl:
    faults = [
        fault("refused"),
        fault("nxdomain"),
        fault("dns_servfail"),
        fault("dns_timeout"),
        fault("dns_slow", delay=DNS_SLOW),
        fault("bad_cert"),
        fault("robots_5xx"),
        fault("robots_huge"),
        fault("robots_garbage"),
        fault("robots_slow", delay=ROBOTS_SLOW_CUT),
        fault("robots_slow", host="h1.test", delay=ROBOTS_SLOW_OK),
        fault("nxdomain", host="h3.test"),  # a site host with many URLs is dead
    ]
    web = webs(SiteConfig(pages=40, hosts=4, seed=5, crawl_delay=0.0), faults)
    started = time.time()
    c = crawl(web, tmp_path_factory.mktemp("hosts") / "c", bad_host_retry=BAD_HOST_RETRY)
    c.marks["started"] = started
    return c


def test_host_faults_end_as_designed_and_nothing_else_is_lost(hosts: Crawl) -> None:
    c = hosts
    # robots.txt that never comes within the limit: its host is "unavailable", so the
    # pages behind its home page are never found (the oracle waits for ever).
    slow = {u for u in c.want.fetched if host_name(u) == "robotsslow.test"}
    assert c.answered() == set(c.want.fetched) - slow
    assert {u: r.status for u, r in c.recs.items() if r.status} == {
        u: s for u, s in c.want.status.items() if u not in slow
    }
    dead = ("dns_", "connect_refused", "tls", "bad_host:")
    assert {u for u, r in c.recs.items() if r.reason.startswith(dead)} == set(c.want.unreachable)
    blocked = {u for u, r in c.recs.items() if r.reason.startswith("robots_")}
    slow_blocked = {u for u in c.want.blocked if host_name(u) == "robotsslow.test"}
    assert blocked == set(c.want.blocked) - slow_blocked | {c.url("robotsslow.test", "/")}


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("refused.test", "connect_refused"),
        ("nx.test", "dns_nxdomain"),
        ("servfail.test", "dns_servfail"),
        ("dnstimeout.test", "dns_timeout"),
        ("badcert.test", "tls"),
    ],
)
def test_unreachable_host_goes_to_bad_hosts_with_a_retry_time(
    hosts: Crawl, host: str, reason: str
) -> None:
    c = hosts
    rec = c.recs[c.url(host, "/")]
    assert (rec.status, rec.reason) == (0, reason)
    assert not c.web.log.records(host=host)  # no HTTP request ever reached it
    assert c.web.dns is not None and len(c.web.dns.queries(host)) == 1  # one lookup, ever
    entry = bad_hosts(c.data)[host]
    assert entry["reason"] == reason
    started = c.marks["started"]
    assert started + BAD_HOST_RETRY <= entry["retry_at"] <= rec.fetched_at + BAD_HOST_RETRY


def test_a_dead_site_host_is_looked_up_once_and_its_urls_recorded(hosts: Crawl) -> None:
    c = hosts
    assert c.web.dns is not None
    assert len(c.web.dns.queries("h3.test")) == 1
    reasons = sorted(r.reason for u, r in c.recs.items() if host_name(u) == "h3.test")
    assert len(reasons) > 3
    assert reasons == ["bad_host:dns_nxdomain"] * (len(reasons) - 1) + ["dns_nxdomain"]


def test_dns_timeout_bounds_the_lookup(hosts: Crawl) -> None:
    c = hosts
    assert c.web.dns is not None
    queries = c.web.dns.queries("dnstimeout.test")
    assert queries, "the name was never asked"
    first = queries[0].time
    # One lookup (then BadHosts and the negative cache), no query after its deadline.
    assert all(q.time - first <= LIMITS["dns_timeout"] for q in queries)
    # The URL was recorded when the lookup's timeout ran out: not before (nothing else
    # cut it short; the server logs a query when its thread gets to it, in a process
    # busy with the crawl, hence the 0.25 s), and not long after (1 s of scheduling
    # slack here, so that a lookup of three times its timeout fails).
    took = c.recs[c.url("dnstimeout.test", "/")].fetched_at - first
    assert LIMITS["dns_timeout"] - 0.25 <= took <= LIMITS["dns_timeout"] + 1.0, took


def test_slow_dns_within_the_timeout_is_waited_for(hosts: Crawl) -> None:
    c = hosts
    for target in ("/", "/e/1.html", "/e/2.html"):
        assert c.recs[c.url("dnsslow.test", target)].status == 200
    assert c.web.dns is not None and len(c.web.dns.queries("dnsslow.test")) == 1


def test_robots_5xx_disallows_for_now_and_is_fetched_again_after_a_backoff(hosts: Crawl) -> None:
    c = hosts
    reqs = tries(c.web, c.url("robots5xx.test", "/robots.txt"))
    assert [r.status for r in reqs] == [503] * TRIES
    backoff = LIMITS["backoff"]
    assert [g >= backoff * 2**k - EPS for k, g in enumerate(gaps(reqs))] == [True] * (TRIES - 1)
    assert {r.path for r in c.web.log.records(host="robots5xx.test")} == {"/robots.txt"}
    assert c.recs[c.url("robots5xx.test", "/")].reason == "robots_unavailable"


def test_robots_huge_is_parsed_up_to_the_cap(hosts: Crawl) -> None:
    c = hosts
    assert c.recs[c.url("robotshuge.test", "/e/1.html")].status == 200
    assert c.recs[c.url("robotshuge.test", "/e/2.html")].reason == "robots_disallowed"
    rules = c.engine.robots.peek(robots_key(c.url("robotshuge.test", "/")))
    assert rules is not None and rules.truncated
    assert 500 * KIB <= rules.size <= DEFAULT_MAX_ROBOTS_BYTES


def test_robots_garbage_allows_all(hosts: Crawl) -> None:
    c = hosts
    for target in ("/", "/e/1.html", "/e/2.html"):
        assert c.recs[c.url("robotsgarbage.test", target)].status == 200


def test_robots_slow_past_the_limit_is_unavailable_and_retried(hosts: Crawl) -> None:
    c = hosts
    reqs = tries(c.web, c.url("robotsslow.test", "/robots.txt"))
    assert len(reqs) == TRIES
    # Each try was cut at the total limit (the server's log closes it only after its delay),
    # then the host waited its backoff, doubled each time.
    starts = [b.start - a.start for a, b in zip(reqs, reqs[1:], strict=False)]
    backoff, limit = LIMITS["backoff"], LIMITS["total_timeout"]
    # 0.15 s of slack: a loaded server logs a start late (seen: 0.05 s was too little at
    # load 5, then 0.1 s beside a CI run), and a backoff that never doubled still fails the
    # second gap (it would be 1.2 s against the 1.25 s asked).
    assert [g >= limit + backoff * 2**k - 0.15 for k, g in enumerate(starts)] == [True] * 2, \
        starts
    assert {r.path for r in c.web.log.records(host="robotsslow.test")} == {"/robots.txt"}
    assert c.recs[c.url("robotsslow.test", "/")].reason == "robots_unavailable"


def test_robots_slow_within_the_limit_is_waited_for_and_obeyed(hosts: Crawl) -> None:
    c = hosts
    (req,) = tries(c.web, c.url("h1.test", "/robots.txt"))
    assert req.status == 200 and req.end - req.start >= ROBOTS_SLOW_OK - EPS
    h1 = {u for u in c.want.fetched if host_name(u) == "h1.test"}
    assert h1 and h1 <= c.answered()


def test_robots_404_allows_all(hosts: Crawl) -> None:
    c = hosts
    (req,) = tries(c.web, c.url("h2.test", "/robots.txt"))
    assert req.status == 404
    assert not [u for u, r in c.recs.items() if host_name(u) == "h2.test" and r.reason]


def test_status_json_counts_host_faults_by_class(hosts: Crawl) -> None:
    snap = status_json(hosts.data)
    outcomes, classes = snap["outcomes"], snap["classes"]
    for key in (
        "dns_nxdomain",
        "dns_servfail",
        "dns_timeout",
        "connect_refused",
        "tls",
        "robots_unavailable",
        "robots_disallowed",
        "bad_host:dns_nxdomain",
    ):
        assert outcomes[key] >= 1, key
    assert outcomes["retry:robots_unavailable"] == 2 * LIMITS["max_retries"]
    assert classes["dns"] == 4 and classes["connect"] == 2
    assert classes["bad_host"] == outcomes["bad_host:dns_nxdomain"]
    assert snap["bad_hosts"] == 6


# -- the spider trap -----------------------------------------------------------------------


def test_spider_trap_is_bounded_by_max_depth(make_testweb: MakeWeb, tmp_path: Path) -> None:
    web = make_testweb(pages=20, hosts=2, seed=6, crawl_delay=0.0, faults=[fault("spider_trap")])
    c = crawl(web, tmp_path / "c", oracle=dict(max_depth=6), max_depth=6, per_host=2)
    assert any("/x/spider_trap/" in u for u in c.want.fetched)
    assert any("/x/spider_trap/" in u for u in c.want.too_deep)
    assert c.answered() == set(c.want.fetched)
    assert web.log.urls() == set(c.want.requests) and not web.log.duplicates()


def test_spider_trap_is_bounded_by_max_pages_per_host_and_other_hosts_finish(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    trap_host = "h1.test"
    web = make_testweb(
        pages=30, hosts=3, seed=3, crawl_delay=0.0, faults=[fault("spider_trap", host=trap_host)]
    )
    limit = 15  # above what h0 and h2 have, below h1's own pages (and its trap)
    c = crawl(
        web,
        tmp_path / "c",
        max_pages_per_host=limit,
        per_host=2,
        oracle=dict(scope=lambda u: "/x/spider_trap/" not in u),
    )
    pages = [r for r in web.log.records(host=trap_host) if r.path not in META_PATHS]
    assert len(pages) == limit and not web.log.duplicates()
    cut = [u for u, r in c.recs.items() if r.reason == "host_page_limit"]
    assert cut and all(host_name(u) == trap_host for u in cut)
    assert status_json(c.data)["classes"]["limit"] == len(cut)
    # The other hosts finish: all they have that is reachable without the cut host, and
    # nothing the crawl without a trap would not have fetched.
    lower = web.oracle.crawl(scope=lambda u: host_name(u) != trap_host).fetched
    upper = {u for u in c.want.fetched if host_name(u) != trap_host}
    got = {u for u in c.answered() if host_name(u) != trap_host}
    assert set(lower) <= got <= upper
    assert max(sum(host_name(u) == h for u in upper) for h in ("h0.test", "h2.test")) < limit


# -- dead hosts cost no politeness delay -------------------------------------------------------


def test_urls_decided_without_a_request_cost_their_host_no_delay() -> None:
    """A dead host's URLs (BadHosts, cached robots verdicts) are recorded back to back:
    releasing them with ``contacted=False`` does not start the host's delay."""
    now = [100.0]
    s = Scheduler(
        per_host=1, delay=30.0, max_waiting=10, max_waiting_per_host=10, clock=lambda: now[0]
    )
    for i in range(3):
        s.offer("dead.test", i)
    for want in (0, 1, 2):
        got = s.next(timeout=0)
        assert got is not None and got[1] == want
        s.release(got[0], contacted=False)
    s.offer("dead.test", 3)
    got = s.next(timeout=0)
    assert got is not None
    s.release(got[0])  # a real request: now the delay holds
    s.offer("dead.test", 4)
    assert s.next(timeout=0) is None
    now[0] += 30.0
    assert s.next(timeout=0) is not None


# -- the host backoff on failing pages --------------------------------------------------------

BACKOFF, BACKOFF_CAP = 0.25, 2.0
# Page answers in arrival order, the seed aside: five failures in a row (the backoff
# doubles up to its cap: 0.25, 0.5, 1, 2, 2 s), one success (the backoff starts over),
# one failure (0.25 s again), then only successes.
SCRIPT = [500] * 5 + [200, 500]


def expected_wait(statuses: list[int]) -> float:
    """The host's wait after the last of ``statuses``: the backoff for the failures in
    a row that end the list, or no wait (--delay 0) after a success."""
    failures = len(list(itertools.takewhile(lambda x: x >= 500, reversed(statuses))))
    return min(BACKOFF * 2 ** (failures - 1), BACKOFF_CAP) if failures else 0.0


def test_host_backoff_doubles_to_its_cap_and_starts_over_after_a_success(
    testweb: TestWeb, tmp_path: Path
) -> None:
    """The server answers by arrival order, whatever the URL, so the failures in a row
    are the host's: every gap between two requests is the host's backoff (from below
    and from above), which is what BACKOFF doubling, BACKOFF_CAP and the reset set."""
    pages = [f"/p{i}.html" for i in range(12)]

    def answer(path: str, hits: list[Hit]) -> Answer:
        if path in ("/robots.txt", "/sitemap.xml"):
            return 404, [], b""
        if path == "/":
            return html_links(pages)
        n = sum(h.path not in ("/", "/robots.txt", "/sitemap.xml") for h in hits)
        if n < len(SCRIPT) and SCRIPT[n] >= 500:
            return SCRIPT[n], [("Content-Type", "text/plain")], b"failed, try later\n"
        return html_links([])

    with LocalServer(answer) as server:
        settings = {**LIMITS, "backoff": BACKOFF, "max_retry_after": BACKOFF_CAP}
        engine = run_crawl(testweb, tmp_path / "c", seeds=[server.url("/")], **settings)
    assert engine.complete  # type: ignore[attr-defined]
    hits = sorted((h for h in server.hits if h.path not in ("/robots.txt", "/sitemap.xml")),
                  key=lambda h: h.start)
    statuses = [h.status for h in hits]
    assert statuses[: 1 + len(SCRIPT)] == [200, *SCRIPT]
    assert set(statuses[1 + len(SCRIPT) :]) == {200}
    assert {h.path for h in hits} == {"/", *pages}  # every page answered in the end
    for i, (a, b) in enumerate(itertools.pairwise(hits)):
        wait, gap = expected_wait(statuses[: i + 1]), b.start - a.end
        assert wait - EPS <= gap <= wait + SLACK, (i, statuses[: i + 1], wait, gap)


def test_robots_txt_reached_after_five_redirects_is_obeyed(
    testweb: TestWeb, tmp_path: Path
) -> None:
    """RFC 9309 §2.3.1.2: follow at least five redirects to robots.txt; past those it is
    unavailable (allow all)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        hops = 5  # /robots.txt -> /r1 -> ... -> /r<hops>, which disallows everything

        asked: list[str] = []  # for a failure's message

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.asked.append(self.path)
            if self.path == "/robots.txt" or self.path.startswith("/r"):
                step = 0 if self.path == "/robots.txt" else int(self.path[2:])
                if step < self.hops:
                    self._answer(301, b"", ("Location", f"/r{step + 1}"))
                else:
                    self._answer(200, b"User-agent: *\nDisallow: /\n")
            else:
                self._answer(200, b"<html><body>page</body></html>", ("Content-Type", "text/html"))

        def _answer(self, status: int, body: bytes, *headers: tuple[str, str]) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    for hops, reason in ((5, "robots_disallowed"), (6, "")):
        Handler.hops = hops
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            seed = f"http://127.0.0.1:{server.server_address[1]}/page"
            data = tmp_path / f"hops{hops}"
            Handler.asked = []
            engine = run_crawl(testweb, data, seeds=[seed], **LIMITS)
            recorded = records(data)
            # seen once under a loaded CI: the seed not recorded at all; say what happened
            assert seed in recorded, (hops, engine.complete, engine.status_counts(),
                                      Handler.asked, recorded)
            got = recorded[seed]
            assert (got.reason, got.status) == (reason, 0 if reason else 200), hops
        finally:
            server.shutdown()
            server.server_close()
