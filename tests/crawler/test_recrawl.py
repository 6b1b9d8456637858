"""``python -m crawler recrawl``: fetched pages re-queued, fetched again with a conditional
GET from their records; a 304 keeps the stored body and says so, a changed page replaces
it, the WARC export writes a server-not-modified revisit (tests/crawler/test_pywb_replay.py
replays it)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from crawl_helpers import (
    META_PATHS,
    Answer,
    Hit,
    LocalServer,
    html_links,
    record,
    records,
    run_cli,
    run_crawl,
)
from test_warc_export import read_warc

import kvstore
from crawler.cli._common import parse_age
from crawler.state.recrawl import RecrawlSelection
from tools.testweb import SiteConfig, TestWeb
from tools.testweb.export import export, nginx_serving
from tools.testweb.graph import Graph
from tools.testweb.site import Site

NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"


def cli(*args: str) -> list[str]:
    return ["python", "-m", "crawler", *args]


# The site's robots.txt Crawl-delay is 0 here: a 1 s delay on h1.test made every crawl
# of these tests take ~10 s and proves nothing about a recrawl (test_crawl.py and
# test_options.py hold the crawler to a Crawl-delay).


def small_web() -> TestWeb:
    return TestWeb(SiteConfig(hosts=2, pages=30, seed=5, crawl_delay=0.0)).start()


def test_a_recrawl_of_an_unchanged_site_is_all_304s_and_keeps_every_body(tmp_path: Path) -> None:
    web = small_web()
    data = tmp_path / "c"
    try:
        assert run_crawl(web, data).complete
        before = {u: record(data, u) for u, r in records(data).items() if r.status}
        time.sleep(0.05)
        done = run_cli(cli("recrawl", str(data), "--older-than", "0s"))
        assert done.returncode == 0, done.stderr
        assert f"re-queued {len(before)} pages" in done.stdout
        n = len(web.log.records())
        assert run_crawl(web, data).complete
        again = [r for r in web.log.records()[n:] if r.path not in META_PATHS]
        assert sorted(r.url for r in again) == sorted(before), "each page asked once"
        pages = {u for u, rec in before.items() if rec.status == 200 and rec.body}
        assert pages, "the site has pages with bodies"
        assert {r.url for r in again if r.status == 304} == pages
        for url, old in before.items():
            new = record(data, url)
            assert new.fetched_at > old.fetched_at
            if url in pages:
                assert (new.status, new.revisit, new.revisit_of) == (200, "not_modified",
                                                                     old.fetched_at)
                assert new.body == old.body and new.links == old.links
            else:  # a redirect, a 404: fetched anew
                assert (new.status, new.revisit) == (old.status, "")
        with kvstore.open(data / "prior", readonly=True) as prior:
            assert len(prior) == 0, "the records set aside were forgotten once answered"
        # A second recrawl of a 304'd page keeps the first fetch as what it revisits.
        assert run_cli(cli("recrawl", str(data), "--older-than", "0")).returncode == 0
        assert run_crawl(web, data).complete
        url = sorted(pages)[0]
        assert record(data, url).revisit_of == before[url].fetched_at
    finally:
        web.stop()


def test_the_warc_of_a_304_is_the_kept_response_and_a_not_modified_revisit(
    tmp_path: Path,
) -> None:
    web = small_web()
    data = tmp_path / "c"
    try:
        assert run_crawl(web, data).complete
        url = web.seed_url
        first = record(data, url)
        assert run_cli(cli("recrawl", str(data), "--older-than", "0s")).returncode == 0
        assert run_crawl(web, data).complete
        warc = tmp_path / "out.warc.gz"
        done = run_cli(cli("export", str(data), "--warc", str(warc)))
        assert done.returncode == 0, done.stderr
        recs = [r for r in read_warc(warc) if r.headers.get("WARC-Target-URI") == url]
        kinds = [r.type for r in recs]
        assert kinds.count("response") == 1 and kinds.count("revisit") == 1, kinds
        resp = next(r for r in recs if r.type == "response")
        rev = next(r for r in recs if r.type == "revisit")
        assert resp.payload == first.body and resp.status == 200
        # The block is the stored response as the 304 freshened it (replay tools do not
        # load the body of a revisit whose status is 3xx); the header says it was a 304.
        assert rev.status == 200 and rev.http["x-crawler-original-status"] == "304"
        assert rev.headers["WARC-Profile"] == NOT_MODIFIED_PROFILE
        assert rev.headers["WARC-Refers-To"] == resp.headers["WARC-Record-ID"]
        assert rev.headers["WARC-Refers-To-Date"] == resp.headers["WARC-Date"]
        assert rev.headers["WARC-Payload-Digest"] == resp.headers["WARC-Payload-Digest"]
        assert rev.headers["WARC-Date"] > resp.headers["WARC-Date"]
        assert "etag" in rev.http
    finally:
        web.stop()


def test_a_changed_page_replaces_the_record_and_the_validators_were_sent(
    tmp_path: Path,
) -> None:
    version = {"n": 1}

    def answer(path: str, hits: list[Hit]) -> Answer:
        if path in META_PATHS:
            return 404, [], b""
        status, headers, body = html_links([f"/v{version['n']}.html"] if path == "/" else [])
        return status, [*headers, ("ETag", f'"v{version["n"]}"'),
                        ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")], body

    web = small_web()  # only for the crawl's settings (DNS, CA); the pages are local
    data = tmp_path / "c"
    try:
        with LocalServer(answer) as server:
            home = server.url("/")
            assert run_crawl(web, data, seeds=[home]).complete
            old = record(data, home)
            version["n"] = 2
            done = run_cli(cli("recrawl", str(data), "--older-than", "0s", "--host",
                               "127.0.0.1"))
            assert done.returncode == 0, done.stderr
            n = len(server.hits)
            assert run_crawl(web, data, seeds=[home]).complete
            asked = [h for h in server.hits[n:] if h.path == "/"]
        assert len(asked) == 1
        assert asked[0].headers["if-none-match"] == '"v1"'
        assert asked[0].headers["if-modified-since"] == "Mon, 01 Jan 2024 00:00:00 GMT"
        new = record(data, home)
        assert new.revisit == "" and new.body != old.body and b"/v2.html" in new.body
        # The new link is followed; the old page stays recorded from the first run.
        assert {server.url("/v1.html"), server.url("/v2.html")} <= set(records(data))
    finally:
        web.stop()


def test_selection_dry_run_and_mistakes(tmp_path: Path) -> None:
    web = small_web()
    data = tmp_path / "c"
    try:
        assert run_crawl(web, data).complete
        fetched = {u for u, r in records(data).items() if r.status}
        h1 = {u for u in fetched if "//h1.test" in u}
        assert h1 and h1 != fetched
        none = run_cli(cli("recrawl", str(data), "--older-than", "7d"))
        assert (none.returncode, none.stdout.strip()) == (0, f"recrawl {data}: no pages to "
                                                             "re-queue")
        dry = run_cli(cli("recrawl", str(data), "--older-than", "0s", "--host", "h1.test",
                          "--dry-run"))
        assert dry.returncode == 0 and f"would re-queue {len(h1)} page" in dry.stdout
        with kvstore.open(data / "prior", readonly=True) as prior:
            assert len(prior) == 0  # a dry run writes nothing
        assert {u for u, r in records(data).items() if r.status} == fetched
        n404 = sum(1 for r in records(data).values() if r.status == 404)
        ok404 = run_cli(cli("recrawl", str(data), "--older-than", "0s", "--status", "404"))
        assert ok404.returncode == 0 and (f"re-queued {n404} page" in ok404.stdout
                                          if n404 else "no pages" in ok404.stdout)
        bad = run_cli(cli("recrawl", str(data), "--older-than", "soon"))
        assert bad.returncode == 2 and "bad age 'soon'" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        web.stop()


def test_ages_and_the_selection_rule() -> None:
    assert [parse_age(a) for a in ("90", "90s", "30m", "12h", "7d", "2w")] == [
        90, 90, 1800, 43200, 604800, 1209600]
    sel = RecrawlSelection(3600, hosts=("H0.test.",), now=10_000.0)
    from crawler.state.pages import PageRecord

    def page(url: str, status: int, at: float) -> PageRecord:
        return PageRecord(url=url, status=status, fetched_at=at, depth=0)

    assert sel.matches(page("http://h0.test/", 200, 6_400.0))
    assert not sel.matches(page("http://h0.test/", 200, 6_401.0))  # too young
    assert not sel.matches(page("http://h1.test/", 200, 0.0))  # another host
    assert not sel.matches(page("http://h0.test/", 0, 0.0))  # no HTTP answer: retry's job


@pytest.mark.system_packages("nginx-light")
def test_a_recrawl_of_a_site_on_nginx_is_all_304s(tmp_path: Path) -> None:
    """nginx answers conditional GETs for static files from their ETag and mtime: the
    test web exported and served by it, crawled, recrawled: nothing downloaded again."""
    config = SiteConfig(pages=60, hosts=3, seed=6, crawl_delay=0.0)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    root = tmp_path / "site"
    export(Graph(config), root, http_port=ports[0], https_port=ports[1])
    site = Site(Graph(config), http_port=ports[0], https_port=ports[1])
    web = TestWeb(config).start()  # for its DNS: the site's host names on 127.0.0.1
    data = tmp_path / "c"
    try:
        with nginx_serving(root, ports[0]):
            tls = {"ca_bundle": str(root / "tls/ca.pem")}
            assert run_crawl(web, data, seeds=[site.seed_url], **tls).complete
            pages = {u for u, r in records(data).items() if r.status == 200}
            assert len(pages) > 40
            assert run_cli(cli("recrawl", str(data), "--older-than", "0s")).returncode == 0
            assert run_crawl(web, data, seeds=[site.seed_url], **tls).complete
        again = {u: record(data, u) for u in pages}
        assert {u for u, r in again.items() if r.revisit == "not_modified"} == pages
        assert all(r.body for r in again.values())
    finally:
        web.stop()
