"""A mixed hostile run: 20 hosts, each with its own faults, crawled through the CLI with
kill -9s at random moments, then run to completion; the final MainDB matches the oracle.

The CLI runs with its default limits (backoff, retries, DNS timeout, body caps,
redirect hops, URL length) and ``--timeout 3``, so the fault knobs are chosen
to play out in seconds: what each fault must end as is in docs/HOSTILE.md and
tests/crawler/test_hostile.py; here it is all of them at once, across kills.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from crawl_helpers import cli_args, host_name, records, start_cli, wait_for_answers

from crawler.config import DEFAULT_MAX_URL_LENGTH
from tools.testweb import TestWeb, fault

MakeWeb = Callable[..., TestWeb]
MiB = 1 << 20
# The spider trap is on the seed host, whose /x/ hub is at depth 1 by one path only, so
# the trap's depths do not depend on the order of the crawl. (Elsewhere a URL keeps the
# depth of the first path that found it, where the oracle takes the shortest; the site's
# own pages are at most 7 deep, so 12 leaves them slack.)
MAX_DEPTH = 12
KILLS = 3

# host -> its faults. Response faults without a prefix get their own page /x/<kind>/1
# on that host; feature faults a subtree /x/<kind>/; host faults break the whole host.
FAULTS = {
    "h0.test": [
        fault("redirects", host="h0.test"),
        fault("link_schemes", host="h0.test"),
        fault("base_href", host="h0.test"),
        fault("spider_trap", host="h0.test"),
    ],
    "h1.test": [
        fault("slow_first_byte", host="h1.test", delay=0.5),
        fault("charsets", host="h1.test"),
    ],
    "h2.test": [
        fault("slow_drip", host="h2.test"),  # 10 s: past the 3 s total limit
        fault("wrong_type", host="h2.test"),
    ],
    "h3.test": [fault("reset", host="h3.test"), fault("malformed", host="h3.test")],
    "h4.test": [fault("huge_body", host="h4.test", size=16 * MiB), fault("binary", host="h4.test")],
    "h5.test": [
        fault("gzip_bomb", host="h5.test", size=32 * MiB),
        fault("meta_robots", host="h5.test"),
    ],
    "h6.test": [
        fault("status_429", host="h6.test", retry_after=1),
        fault("long_urls", host="h6.test"),
    ],
    "h7.test": [
        fault("status_503", host="h7.test", retry_after=1, times=2),
        fault("idn", host="h7.test"),
    ],
    "h8.test": [fault("status_500", host="h8.test"), fault("base_href", host="h8.test")],
    "h9.test": [
        fault("slow_first_byte", host="h9.test", prefix="/s1/", delay=0.3),  # its pages
        fault("meta_robots", host="h9.test"),
    ],
    "h10.test": [fault("refused", host="h10.test")],
    "h11.test": [fault("nxdomain", host="h11.test")],
    "h12.test": [fault("dns_servfail", host="h12.test")],
    "h13.test": [fault("dns_timeout", host="h13.test")],
    "h14.test": [fault("dns_slow", host="h14.test", delay=1.0)],
    "h15.test": [fault("robots_5xx", host="h15.test")],
    "h16.test": [fault("robots_huge", host="h16.test")],
    "h17.test": [fault("robots_garbage", host="h17.test")],
    "h18.test": [fault("robots_slow", host="h18.test", delay=1.0)],
    "h19.test": [fault("bad_cert", host="h19.test")],  # the site's HTTPS host
}
# Faults whose designed outcome is a recorded failure where the oracle (which waits for
# ever) counts an answer: (host, path) -> reason.
FAILURES = {("h2.test", "/x/slow_drip/1"): "total_timeout", ("h3.test", "/x/reset/1"): "reset"}
DEAD = ("dns_", "connect_refused", "tls", "bad_host:")
DEAD_HOSTS = {
    "h10.test": "connect_refused",
    "h11.test": "dns_nxdomain",
    "h12.test": "dns_servfail",
    "h13.test": "dns_timeout",
    "h19.test": "tls",
}


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.communicate()


@pytest.mark.slow
def test_mixed_hostile_crawl_with_kills_ends_as_the_oracle(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    faults = [f for fs in FAULTS.values() for f in fs]
    web = make_testweb(pages=300, hosts=20, seed=12, crawl_delay=0.0, faults=faults)
    want = web.oracle.crawl(max_depth=MAX_DEPTH, max_url_length=DEFAULT_MAX_URL_LENGTH)
    data = tmp_path / "c"
    args = cli_args(web, data, "--timeout", "3", "--max-depth", str(MAX_DEPTH))
    rng = random.Random(5)
    for _ in range(KILLS):
        proc = start_cli(args)
        # Each kill lands after the run has made progress. robots.txt of h15 answers 503
        # until the run gives up on it, 15 s of backoff later, so no run can be complete
        # before it.
        wait_for_answers(web, proc, rng.randint(10, 60))
        kill(proc)
    final = start_cli(args)
    out, err = final.communicate(timeout=240)
    assert final.returncode == 0, err.decode()[-3000:]
    assert b"crawl complete" in out

    recs = records(data)
    failed = {web.url(h, t): reason for (h, t), reason in FAILURES.items()}
    # Every URL the oracle reaches is recorded, and nothing else.
    assert set(recs) == set(want.fetched) | set(want.blocked) | set(want.unreachable)
    # Answered URLs and their statuses, as the oracle; the designed failures as designed.
    assert {u for u, r in recs.items() if r.status > 0} | set(failed) == set(want.fetched)
    for url in want.fetched:
        if url in failed:
            assert (recs[url].status, recs[url].reason) == (0, failed[url]), url
        else:
            assert recs[url].status == want.status[url], url
    # robots.txt: 5xx is "unavailable", the rest obeyed; unreachable hosts as such.
    blocked = {u for u, r in recs.items() if r.reason.startswith("robots_")}
    assert blocked == set(want.blocked)
    unavailable = {u for u, r in recs.items() if r.reason == "robots_unavailable"}
    assert unavailable == {u for u in want.blocked if host_name(u) == "h15.test"}
    assert unavailable
    assert {u for u, r in recs.items() if r.reason.startswith(DEAD)} == set(want.unreachable)
    assert {u for u, r in recs.items() if r.noindex} == set(want.noindex)
    # Limits: cut bodies are recorded as truncated; the trap ended at the depth limit:
    # its pages down to MAX_DEPTH were fetched, the next ones never requested.
    assert recs[web.url("h4.test", "/x/huge_body/1")].truncated == "too_large"
    assert recs[web.url("h5.test", "/x/gzip_bomb/1")].truncated == "decompression_bomb"
    trap = [u for u, r in recs.items() if "/x/spider_trap/" in u and r.status > 0]
    assert len(trap) == 2 * (MAX_DEPTH - 2) + 1  # 2024-01 is at depth 2, each month one more
    assert max(r.depth for r in recs.values()) == MAX_DEPTH
    too_deep = {u for u in want.too_deep if "/x/spider_trap/" in u}
    assert too_deep and not too_deep & (set(recs) | web.log.urls())
    # Every host was met, and each one's faults showed in what the crawl met.
    assert {host_name(u) for u in recs} >= set(FAULTS)
    answers = {(r.host, r.path): [] for r in web.log.records()}
    for r in sorted(web.log.records(), key=lambda r: r.start):
        answers[(r.host, r.path)].append(r.status)
    assert answers[("h6.test", "/x/status_429/1")][:2] == [429, 200]
    assert answers[("h7.test", "/x/status_503/1")][:3] == [503, 503, 200]
    assert set(answers[("h8.test", "/x/status_500/1")]) == {500}
    assert recs[web.url("h8.test", "/x/status_500/1")].status == 500
    for host, reason in DEAD_HOSTS.items():
        reasons = {r.reason for u, r in recs.items() if host_name(u) == host}
        # (only the BadHosts verdict, if a kill fell between marking it and the record)
        assert reasons and reasons <= {reason, "bad_host:" + reason}, (host, reasons)
        assert not web.log.records(host=host), host
    for host in ("h14.test", "h16.test", "h17.test", "h18.test"):  # slow DNS, odd robots.txt
        assert any(r.status == 200 for u, r in recs.items() if host_name(u) == host), host
