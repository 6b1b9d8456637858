"""Sitemaps (--sitemaps): read from robots.txt's Sitemap lines and /sitemap.xml, against the
test web's sitemap feature (tools/testweb/sitemapped.py): an index that lists itself,
nested indexes past the nesting limit, gzip, a gzip bomb, a 1 GB file, garbage XML,
off-host entries, a text sitemap, an HTML page where a sitemap should be, a 404."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import cli_args, records, run_cli, run_crawl, start_cli, wait_for

from crawler.read.sitemaps import sitemap_records
from crawler.run import sitemaps as crawler_sitemaps
from crawler.run.engine import Engine
from crawler.run.sitemaps import SitemapTask
from crawler.state.sitemapstore import SitemapStore
from crawler.web.robots import RobotsRules
from crawler.web.urls import parse
from tools.testweb import TestWeb, fault
from tools.testweb import oracle as testweb_oracle
from tools.testweb.graph import SiteConfig

REPO = Path(__file__).resolve().parents[2]


def sitemap_web(crawl_delay: float = 0.0) -> TestWeb:
    """The sitemap site. Its robots.txt Crawl-delay is 0 unless a test needs a crawl that
    lasts: a 1 s delay on h1.test made each crawl ~7 s and proves nothing about sitemaps
    (test_crawl.py and test_options.py hold the crawler to a Crawl-delay)."""
    config = SiteConfig(hosts=3, pages=30, seed=11, crawl_delay=crawl_delay)
    return TestWeb(config, faults=[fault("sitemaps")]).start()


def fetched(data: Path) -> set[str]:
    return {u for u, r in records(data).items() if r.status}


def sitemap_url(web: TestWeb, name: str) -> str:
    return web.site.url("h0.test", "/x/sitemaps/" + name)


def by_url(data: Path) -> dict[str, dict[str, Any]]:
    return {r["url"]: r for r in sitemap_records(str(data))}


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path, Engine]]:
    """One crawl of the sitemap web with the defaults (--sitemaps all), shared."""
    web = sitemap_web()
    data = tmp_path_factory.mktemp("sitemaps") / "c"
    try:
        yield web, data, run_crawl(web, data, status_interval=0.2)
    finally:
        web.stop()


def test_the_crawler_and_the_oracle_agree_on_limits() -> None:
    assert crawler_sitemaps.MAX_SITEMAPS_PER_HOST == testweb_oracle.MAX_SITEMAPS_PER_HOST
    assert crawler_sitemaps.MAX_SITEMAP_NESTING == testweb_oracle.MAX_SITEMAP_NESTING


def test_sitemap_only_pages_are_fetched_and_nothing_else(
    crawled: tuple[TestWeb, Path, Engine],
) -> None:
    web, data, engine = crawled
    assert engine.complete
    want = web.oracle.crawl()
    only = web.oracle.sitemap_only()
    assert len(only) >= 8, "the feature has pages only sitemaps reach"
    assert fetched(data) == set(want.fetched)
    assert only <= fetched(data)
    log = [r.url for r in web.log.records()]
    assert set(log) == set(want.requests)
    counts = Counter(log)
    assert not {u: n for u, n in counts.items() if n > 1}, "a URL requested twice"
    # Pages a sitemap reaches enter at depth 1, as if the home page linked them.
    recs = records(data)
    assert {recs[u].depth for u in only} == {1}


def test_every_sitemap_is_recorded_with_what_it_listed(
    crawled: tuple[TestWeb, Path, Engine],
) -> None:
    web, data, _ = crawled
    want = web.oracle.crawl()
    got = by_url(data)
    assert set(got) == set(want.sitemaps)
    for url, rec in got.items():
        assert [tuple(e) for e in rec["urls"]] == list(want.sitemap_entries[url]), url
    # Each hostile file ends as designed; none is read past its bounds.
    ends = {name: (got[sitemap_url(web, name)]["status"], got[sitemap_url(web, name)]["error"])
            for name in ("index.xml", "bomb.xml.gz", "huge.xml", "garbage.xml",
                         "notasitemap.xml", "missing.xml", "urlset.xml.gz", "plain.txt")}
    assert ends["index.xml"] == (200, "")
    assert ends["urlset.xml.gz"] == (200, "")
    assert ends["plain.txt"] == (200, "")
    assert ends["bomb.xml.gz"] == (200, "too_large")
    assert ends["huge.xml"] == (200, "too_large")
    assert ends["garbage.xml"] == (200, "bad_xml")
    assert ends["notasitemap.xml"][0] == 200 and ends["notasitemap.xml"][1] in (
        "not_sitemap", "bad_xml")
    assert ends["missing.xml"][0] == 404
    index = got[sitemap_url(web, "index.xml")]
    assert index["kind"] == "index" and sitemap_url(web, "nested.xml") in index["children"]
    assert any(lastmod for rec in got.values() for _, lastmod in rec["urls"]), "lastmod kept"
    assert got[sitemap_url(web, "offhost.xml")]["off_origin"] >= 1
    # The index deeper.xml (level 2) lists toodeep.xml (level 3): not read.
    assert sitemap_url(web, "toodeep.xml") not in got
    assert sitemap_url(web, "deeper.xml") in got


def test_status_and_the_sitemaps_command_show_them(
    crawled: tuple[TestWeb, Path, Engine],
) -> None:
    web, data, engine = crawled
    n = len(web.oracle.crawl().sitemaps)
    status = run_cli(["python", "-m", "crawler", "status", str(data), "--json"])
    assert status.returncode == 0, status.stderr
    sm = json.loads(status.stdout)["sitemaps"]
    assert sm["read"] == n and sm["outcomes"]["too_large"] == 2
    assert sm["urls_admitted"] >= len(web.oracle.sitemap_only())
    assert json.loads(status.stdout)["last_status"]["sitemaps"]["sitemaps_read"] == n
    listing = run_cli(["python", "-m", "crawler", "sitemaps", str(data)])
    assert listing.returncode == 0, listing.stderr
    lines = [line.split("\t") for line in listing.stdout.splitlines()]
    assert len(lines) == n
    assert ["bad_xml", "urlset"] == lines[[x[4] for x in lines].index(
        sitemap_url(web, "garbage.xml"))][:2]
    text = run_cli(["python", "-m", "crawler", "status", str(data)]).stdout
    assert f"sitemaps read: {n} (" in text
    urls = run_cli(["python", "-m", "crawler", "sitemaps", str(data), "--urls"]).stdout
    assert all(u in urls for u in web.oracle.sitemap_only())


@pytest.mark.parametrize(
    "settings, oracle",
    [
        ({"sitemaps": "robots"}, {"sitemaps": "robots"}),
        ({"sitemaps": "off"}, {"sitemaps": "off"}),
        ({"obey_robots": False}, {"obey_robots": False}),
        ({"max_depth": 0}, {"max_depth": 0}),
    ],
    ids=["robots-lines-only", "off", "ignore-robots", "max-depth-0"],
)
def test_modes_match_the_oracle(
    settings: dict[str, Any], oracle: dict[str, Any], tmp_path: Path
) -> None:
    web = sitemap_web()
    try:
        engine = run_crawl(web, tmp_path / "c", **settings)
        assert engine.complete
        want = web.oracle.crawl(**oracle)
        assert fetched(tmp_path / "c") == set(want.fetched)
        assert web.log.urls() == set(want.requests)
        assert set(by_url(tmp_path / "c")) == set(want.sitemaps)
    finally:
        web.stop()


def test_robots_sitemap_lines_are_read_wherever_they_are() -> None:
    body = (b"Sitemap: http://a.test/one.xml\nUser-agent: *\nDisallow: /p\n"
            b"sitemap:/two.xml # a comment\nSITEMAP :  http://b.test/three.xml  \n"
            b"Sitemap:\nUser-agent: other\nDisallow: /\n")
    rules = RobotsRules.from_response(200, body, user_agent="kvcrawl/1", now=0.0)
    assert rules.sitemaps == ("http://a.test/one.xml", "/two.xml", "http://b.test/three.xml")
    assert not rules.can_fetch("http://a.test/p")  # the lines split no group
    many = b"".join(b"Sitemap: /s%d.xml\n" % i for i in range(100))
    assert len(RobotsRules.from_response(200, many, user_agent="x", now=0.0).sitemaps) == 64
    assert RobotsRules.from_response(404, body, user_agent="x", now=0.0).sitemaps == ()


def test_a_sitemap_is_recorded_only_after_its_urls_are_durable(tmp_path: Path) -> None:
    """When the frontier will not take a sitemap's URLs (the crawl is stopping), the
    sitemap is not recorded: the next run reads it again, so no URL of it is lost."""
    web = sitemap_web()
    try:
        from crawl_helpers import config_for

        engine = Engine(config_for(web, tmp_path / "c"))
        url = parse(web.site.url("h0.test", "/sitemap.xml"))
        engine.frontier.close()  # Frontier.receive refuses from now on
        engine.scheduler.offer(url.host, SitemapTask(engine.sitemaps, url, 0), front=True)
        for _ in range(3):  # robots.txt first (the task waits for it), then the sitemap
            got = engine.scheduler.next(timeout=5)
            assert got is not None
            slot, task = got
            task.serve(slot)
            if url.url in web.log.urls():
                break
        assert url.url in web.log.urls(), "the sitemap was fetched"
        assert engine.sitemaps is not None
        assert engine.sitemaps.store.get(url.url) is None
        for fetcher in (engine.fetcher, engine.robots_fetcher):
            fetcher.close()
        engine.sitemaps.close()
        engine.bad_hosts.close()
        engine.robots_store.close()
        assert SitemapStore(str(tmp_path / "c")).get(url.url) is None
    finally:
        web.stop()


def test_kill9_while_reading_sitemaps_then_resume(tmp_path: Path) -> None:
    """A kill -9 once sitemaps are being read, then a resume: the final set is the
    oracle's, and a sitemap recorded before the kill is not requested again."""
    web = sitemap_web(crawl_delay=1.0)  # h1.test's pages keep the crawl going past the kill
    data = tmp_path / "c"
    try:
        args = cli_args(web, data, "--threads", "4", "--delay", "0.02")
        proc = start_cli(args)
        try:
            wait_for(lambda: len(by_url(data)) >= 3, proc, "three sitemaps recorded")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        before = set(by_url(data))
        asked = Counter(r.url for r in web.log.records())
        time.sleep(0.1)
        done = run_cli(args, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        want = web.oracle.crawl()
        assert fetched(data) == set(want.fetched)
        assert set(by_url(data)) == set(want.sitemaps)
        again = Counter(r.url for r in web.log.records())
        assert {u for u in before if again[u] > asked[u]} == set(), "a recorded sitemap refetched"
    finally:
        web.stop()


def test_a_sharded_crawl_reads_each_hosts_sitemaps_once(tmp_path: Path) -> None:
    web = sitemap_web()
    try:
        done = run_cli(cli_args(web, tmp_path / "c")[:-2] + ["--processes", "2"], timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        want = web.oracle.crawl()
        assert fetched(tmp_path / "c") == set(want.fetched)
        assert set(by_url(tmp_path / "c")) == set(want.sitemaps)
        counts = Counter(r.url for r in web.log.records())
        assert all(counts[u] == 1 for u in want.sitemaps)
    finally:
        web.stop()


def test_a_bad_mode_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        ["python", "-m", "crawler", "start", "http://h0.test/", "--data", str(tmp_path / "c"),
         "--sitemaps", "some"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert "not a sitemap mode: 'some'" in done.stderr and "Traceback" not in done.stderr


def test_a_resume_reads_the_children_of_an_index_recorded_before(
    crawled: tuple[TestWeb, Path, Engine], tmp_path: Path
) -> None:
    """A crawl killed after it recorded index.xml but before it read its children: the
    next run does not fetch index.xml again, but reads every child it listed."""
    web, data, _ = crawled
    index = by_url(data)[sitemap_url(web, "index.xml")]
    fresh = sitemap_web()
    try:
        again = tmp_path / "c"
        index = {**index, "url": index["url"].replace(web.site.origin("h0.test"),
                                                      fresh.site.origin("h0.test"))}
        index["children"] = [c.replace(web.site.origin("h0.test"), fresh.site.origin("h0.test"))
                             for c in index["children"]]
        store = SitemapStore(str(again))
        store.put(index)
        store.close()
        assert run_crawl(fresh, again).complete
        want = fresh.oracle.crawl()
        asked = fresh.log.urls()
        assert index["url"] not in asked
        assert set(index["children"]) - {index["url"]} <= asked
        assert fetched(again) == set(want.fetched)
    finally:
        fresh.stop()
