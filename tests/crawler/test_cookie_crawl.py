"""Cookies in a crawl of the test web: the cookie wall (``cookie_wall``: a page that
redirects to itself until its cookie comes back) is crawled, no cookie reaches a host
it was not set for, the jar survives a kill -9, --no-cookies sends none, and the
cookies set are in the WARC export."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from crawl_helpers import (
    META_PATHS,
    cli_args,
    record,
    records,
    run_cli,
    run_crawl,
    start_cli,
    wait_for,
)
from warcio.archiveiterator import ArchiveIterator

from crawler.cli import main
from crawler.state.cookiestore import CookieJar
from crawler.state.settings import load_settings
from crawler.web.urls import parse
from tools.testweb import TestWeb
from tools.testweb.faults import fault

MakeWeb = Callable[..., TestWeb]
WALL = "/x/cookie_wall/page"
INSIDE = "/x/cookie_wall/inside"


def wall_web(make_testweb: MakeWeb) -> TestWeb:
    return make_testweb(pages=30, hosts=3, seed=5, crawl_delay=0.0,
                        faults=[fault("cookie_wall")])


def fetched(data: Path) -> set[str]:
    return {u for u, r in records(data).items() if r.status > 0}


def cookies_sent(web: TestWeb) -> list[tuple[str, str, set[str]]]:
    """(host, path, the cookie names sent) of every request that sent a Cookie header."""
    return [(r.host, r.path, {p.split("=", 1)[0].strip() for p in r.cookie.split(";")})
            for r in web.log.records() if r.cookie is not None]


def warc_headers(data: Path, tmp_path: Path, url: str, kind: str, name: str) -> list[str]:
    """The ``name`` headers of ``url``'s ``kind`` record (response, request) in the
    crawl's WARC export."""
    out = tmp_path / "export.warc.gz"
    if not out.exists():
        assert main(["export", str(data), "--warc", str(out)]) == 0
    with open(out, "rb") as f:
        for rec in ArchiveIterator(f):
            if rec.rec_type == kind and rec.rec_headers.get_header("WARC-Target-URI") == url:
                assert rec.http_headers is not None
                return [v for k, v in rec.http_headers.headers if k == name]
    raise AssertionError(f"no {kind} record of {url}")


def warc_set_cookies(data: Path, tmp_path: Path, url: str) -> list[str]:
    """The Set-Cookie headers of ``url``'s response record in the crawl's WARC export."""
    return warc_headers(data, tmp_path, url, "response", "Set-Cookie")


def test_the_cookie_wall_page_is_crawled_with_its_content(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = wall_web(make_testweb)
    run_crawl(web, tmp_path)
    want = web.oracle.crawl()
    assert fetched(tmp_path) == set(want.fetched)
    page, inside = web.site.url("h0.test", WALL), web.site.url("h0.test", INSIDE)
    assert want.status[page] == 200 and inside in want.fetched
    rec = record(tmp_path, page)
    assert rec.status == 200 and b"behind the cookie wall" in rec.body  # not the redirect
    asked = [(r.status, r.cookie) for r in web.log.records(host="h0.test", path=WALL)]
    assert asked == [(302, None), (200, "kvwall=1; kvsite=1")]  # the wall, then once again
    assert record(tmp_path, inside).status == 200
    assert warc_set_cookies(tmp_path, tmp_path, page) == ["kvseen=1; Max-Age=600; "
                                                          "Path=/x/cookie_wall/"]
    # the request record says what the page was sent, as the server saw it
    assert warc_headers(tmp_path, tmp_path, page, "request", "Cookie") == ["kvwall=1; kvsite=1"]
    assert record(tmp_path, page).cookie == "kvwall=1; kvsite=1"


def test_a_cookie_reaches_only_the_hosts_and_paths_it_was_set_for(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = wall_web(make_testweb)
    run_crawl(web, tmp_path, per_host=1)  # h0's requests one at a time: their order is known
    sent = cookies_sent(web)
    assert sent, "cookies were sent"
    for host, path, names in sent:
        assert host == "h0.test", (host, path, names)  # kvsite is h0.test's, kvleak refused
        assert "kvleak" not in names and "kvsecure" not in names  # a public suffix; not https
        if not path.startswith("/x/cookie_wall/"):
            assert names == {"kvsite"}, (path, names)
    h0 = web.log.records(host="h0.test")
    wall_at = next(i for i, r in enumerate(h0) if r.path == WALL and r.status == 302)
    for r in h0[wall_at + 1:]:  # once set, kvsite goes with every page of h0 (Path=/)
        if r.path not in META_PATHS:  # robots.txt and sitemaps are fetched without cookies
            assert r.cookie is not None and "kvsite=1" in r.cookie, r.target
    assert all(r.cookie is None for r in web.log.records() if r.path in META_PATHS)
    assert [r.cookie for r in h0 if r.path == INSIDE] == ["kvwall=1; kvseen=1; kvsite=1"]


def test_no_cookies_sends_none_and_the_wall_stays_a_redirect(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    web = wall_web(make_testweb)
    data = tmp_path / "c"
    done = run_cli(cli_args(web, data, "--no-cookies"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(r.cookie is None for r in web.log.records())
    want = web.oracle.crawl(cookies=False)
    assert fetched(data) == set(want.fetched)
    page = web.site.url("h0.test", WALL)
    assert record(data, page).status == 302 and web.site.url("h0.test", INSIDE) not in want.fetched
    assert not (data / "cookies").exists()
    saved = load_settings(str(data))
    assert saved is not None and saved["cookies"] is False  # a resume keeps it off
    # The Set-Cookie lines the server sent are in the record and the WARC, one header each.
    assert [c.split(";")[0] for c in warc_set_cookies(data, tmp_path, page)] == [
        "kvwall=1", "kvsite=1", "kvleak=1", "kvsecure=1"]
    assert warc_headers(data, tmp_path, page, "request", "Cookie") == []  # none was sent


def test_the_jar_survives_a_kill9_and_a_resume_sends_its_cookie(
    make_testweb: MakeWeb, tmp_path: Path
) -> None:
    """Killed once the wall's page was answered (its cookie was stored before that second
    request was made); the page fetched again after the resume is let through at once."""
    web = wall_web(make_testweb)
    data = tmp_path / "c"
    args = cli_args(web, data, "--threads", "2")
    proc = start_cli(args)
    try:
        wait_for(lambda: web.log.records(host="h0.test", path=WALL, status=200), proc,
                 "the wall's page answered")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    jar = CookieJar(str(data), readonly=True)
    try:  # kvseen too if the crawler read the page's answer before the kill
        assert {"kvwall=1", "kvsite=1"} <= set(
            jar.header(parse(web.site.url("h0.test", WALL))).split("; "))
    finally:
        jar.close()
    before = len(web.log)
    again = run_cli([sys.executable, "-m", "crawler", "recrawl", str(data), "--older-than", "0",
                     "--host", "h0.test"])
    assert again.returncode == 0, again.stderr[-2000:]
    done = run_cli(args)
    assert done.returncode == 0, done.stderr[-2000:]
    after = [r for r in web.log.records()[before:] if r.host == "h0.test" and r.path == WALL]
    assert [r.status for r in after] == [200]  # no wall: the cookie came back at once
    assert after[0].cookie is not None and "kvwall=1" in after[0].cookie.split("; ")
    assert fetched(data) == set(web.oracle.crawl().fetched)
