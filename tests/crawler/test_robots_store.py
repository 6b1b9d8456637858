"""robots.txt kept on disk across runs (crawler.state.robotsstore): a restart does not
fetch every host's robots.txt again (RFC 9309 §2.4: kept at most 24 hours)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from crawl_helpers import cli_args, fetched_urls, page_refetches, run_cli

from crawler.state.robotsstore import RobotsStore
from crawler.web.robots import DEFAULT_ROBOTS_TTL
from tools.testweb import TestWeb

MakeWeb = Callable[..., TestWeb]
KEY = "http://h0.test:80"


def test_kept_answers_survive_a_reopen_and_expire(tmp_path: Path) -> None:
    store = RobotsStore(str(tmp_path), max_body=10)
    store.save(KEY, 200, b"User-agent: *\nDisallow: /x\n", 1000.0)
    store.save("http://h1.test:80", 404, b"<html>not found</html>", 1000.0)
    store.save("http://h2.test:80", 503, b"", 1000.0)  # "not now": never kept
    store.save("http://h3.test:80", 429, b"", 1000.0)
    store.close()
    again = RobotsStore(str(tmp_path), max_body=10)
    assert again.load(KEY, 1000.0 + 60, DEFAULT_ROBOTS_TTL) == (200, b"User-agent", 1000.0)
    assert again.load("http://h1.test:80", 1001.0, DEFAULT_ROBOTS_TTL) == (404, b"", 1000.0)
    assert again.load("http://h2.test:80", 1001.0, DEFAULT_ROBOTS_TTL) is None
    assert again.load("http://h3.test:80", 1001.0, DEFAULT_ROBOTS_TTL) is None
    assert len(again) == 2
    assert again.load(KEY, 1000.0 + DEFAULT_ROBOTS_TTL, DEFAULT_ROBOTS_TTL) is None  # a day on
    assert again.load(KEY, 999.0, DEFAULT_ROBOTS_TTL) is None  # the clock went back
    again.save(KEY, 200, b"newer", 5000.0)
    assert again.load(KEY, 5001.0, DEFAULT_ROBOTS_TTL) == (200, b"newer", 5000.0)
    again.close()


def test_a_resume_fetches_no_robots_txt_an_earlier_run_has(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = make_testweb(pages=200, hosts=4, seed=3, crawl_delay=0.0)
    data = tmp_path / "c"
    run_cli(cli_args(web, data, "--max-pages", "40"))
    first = len(web.log.records())
    first_hosts = {r.host for r in web.log.records() if r.path == "/robots.txt"}
    done = run_cli(cli_args(web, data))
    assert done.returncode == 0, done.stderr[-2000:]
    assert fetched_urls(data) == set(web.oracle.crawl().fetched)
    assert page_refetches(web) == {}
    robots = Counter(r.host for r in web.log.records() if r.path == "/robots.txt")
    assert robots and max(robots.values()) == 1, robots  # one fetch per host over both runs
    later = {r.host for r in web.log.records()[first:] if r.path != "/robots.txt"}
    assert first_hosts & later, "no host crawled in both runs: the test proves nothing"
