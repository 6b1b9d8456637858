"""``python -m crawler demo``: the main job on a machine with no network (issue 28).

The demo serves its own site on loopback (crawler.cli.demosite), crawls it with
start's defaults (loopback allowed for the demo's own origins only), ranks it and
writes the report. These tests run it as the README prints it, and check what it
made against the site's own tables: every URL with its outcome, the ranks, the
report, a crawl directory the other commands read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from crawl_helpers import REPO, records

from crawler.cli import main
from crawler.cli.demo import REAL_SITE, scope_regex, start_argv
from crawler.cli.demosite import DISALLOWED, HOSTS, OUTSIDE, PAGES, REDIRECTS, SITEMAPS, DemoSite
from crawler.cli.startopts import DEFAULTS
from crawler.config import DEFAULT_DELAY
from crawler.read.rankstore import RankStore
from crawler.state.pages import PageRecord
from crawler.web.urls import url_key

DEMO_TIMEOUT = 300.0  # the demo takes ~10 s on 2 cores; a busy machine gets much longer


def origin(number: int, port: int) -> str:
    return f"http://{HOSTS[number - 1]}:{port}"


def expected_outcomes(port: int) -> dict[str, int | str]:
    """Every URL a complete crawl of the site records, with its status (or reason),
    from the site's tables: its pages (the sitemap's too), its redirects, and each
    link to a path it does not serve (a 404, or refused by robots.txt)."""
    want: dict[str, int | str] = {}
    for n, pages in PAGES.items():
        for path in pages:
            want[origin(n, port) + path] = 200
        for path in REDIRECTS.get(n, {}):
            want[origin(n, port) + path] = 301
    for n, pages in PAGES.items():
        for page in pages.values():
            for link in page.links:
                head, _, path = link.partition("/")
                if head == "outside":
                    continue
                target = n if not head else int(head)
                url = origin(target, port) + "/" + path
                if url not in want:
                    want[url] = "robots_disallowed" if ("/" + path).startswith(
                        DISALLOWED) else 404
    return want


def outcomes(data: Path) -> dict[str, int | str]:
    return {url: rec.status or rec.reason for url, rec in records(data).items()}


def demo_port(data: Path) -> int:
    seeds = (data / "seeds.txt").read_text().split()
    found = re.fullmatch(rf"http://{re.escape(HOSTS[0])}:(\d+)/", seeds[0])
    assert found and len(seeds) == 1, seeds
    return int(found.group(1))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                Path]:
    """``python -m crawler demo --data DIR``, DIR a new directory two levels below an
    existing one (the demo makes it). The demo without --data (its crawl in a new
    temporary directory) is run as the README prints it by tests/test_readme.py, which
    checks that directory; one demo here is enough for what the crawl must be."""
    tmp = tmp_path_factory.mktemp("demo")
    data = tmp / "new" / "demo"
    done = subprocess.run([sys.executable, "-m", "crawler", "demo", "--data", str(data)],
                          cwd=tmp, capture_output=True, text=True, timeout=DEMO_TIMEOUT,
                          env=dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(tmp.glob("kvcrawl-demo-*")), "a temporary directory despite --data"
    assert {"report.html", "settings.json", "rank"} <= {p.name for p in data.iterdir()}
    return done, data


@pytest.mark.slow
def test_the_demo_says_what_it_did_and_how_to_crawl_a_real_site(
    demo_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    done, data = demo_run
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) <= 8
    assert lines[-1] == f"to crawl a real site: {REAL_SITE}"
    assert f"; the crawl is in {data} (" in done.stdout
    assert f"demo: wrote the report: {data / 'report.html'}" in lines
    crawled = next(ln for ln in lines if ln.startswith("demo: crawled it in "))
    assert f": {len(records(data))} URLs, 12 pages, 1 redirect, 1 answered 404, " \
           "1 robots_disallowed" in crawled


def test_the_demo_crawled_every_url_of_its_site(
    demo_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    _, data = demo_run
    port = demo_port(data)
    assert outcomes(data) == expected_outcomes(port)
    # the page no link reaches came from the sitemap
    assert origin(4, port) + SITEMAPS[4][-1] in outcomes(data)


def test_the_demo_crawl_used_starts_defaults_but_for_loopback(
    demo_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    _, data = demo_run
    saved = json.loads((data / "settings.json").read_text())["settings"]
    defaults = json.loads(json.dumps(DEFAULTS))
    changed = {k: v for k, v in saved.items() if v != defaults[k]}
    assert changed == {"allow_private_ips": True, "broad": True,
                       "allow_regex": [rf"^http://127\.0\.0\.[23456]:{demo_port(data)}/"]}


def test_the_demo_ranked_and_reported_its_crawl(
    demo_run: tuple[subprocess.CompletedProcess[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    done, data = demo_run
    with RankStore(str(data)) as ranks:
        top = next(ranks.ordered(1))[1]
    assert f"demo: ranked its pages (PageRank); the strongest is {top}" in done.stdout
    html = (data / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "<svg" in html
    assert origin(1, demo_port(data)) in html
    # a crawl directory like any other: status reads it, pages sorts by its ranks
    assert main(["status", str(data)]) == 0
    assert "finished" in capsys.readouterr().out
    assert main(["pages", str(data), "--sort", "rank", "--limit", "1"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("\t" + top)


class Trap:
    """A listener that counts the connections made to it (none are expected)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_server(address)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def site() -> Iterator[DemoSite]:
    with DemoSite() as s:
        yield s


def test_the_demo_crawl_fetches_only_the_demo_hosts_one_request_a_second(
    site: DemoSite, tmp_path: Path
) -> None:
    trap = Trap((OUTSIDE, site.port))  # the home page links here
    try:
        assert main(start_argv(site, str(tmp_path / "c"))) == 0
    finally:
        trap.close()
    assert trap.connections == 0
    home: PageRecord = records(tmp_path / "c")[site.home]
    outside = url_key(f"http://{OUTSIDE}:{site.port}/")
    assert outside in {key for key, _ in home.link_list()}  # seen, not followed
    assert outcomes(tmp_path / "c") == expected_outcomes(site.port)
    # the default politeness: a host is asked at most once a second
    for host in site.addresses:
        times = [t for t, h, _ in site.requests if h == host]
        assert len(times) >= 3
        assert all(b - a >= DEFAULT_DELAY - 0.01 for a, b in pairwise(times)), host


def test_the_default_start_refuses_the_demo_site(site: DemoSite, tmp_path: Path) -> None:
    """Why the demo allows private addresses: without it, nothing of its site is fetched."""
    data = tmp_path / "c"
    # exit 1: nothing was crawled (docs/CRAWLING.md)
    assert main(["start", site.home, "--data", str(data), "--quiet", "--processes", "1"]) == 1
    assert outcomes(data) == {site.home: "private_ip"}
    assert site.requests == []


def test_the_scope_is_exactly_the_demo_origins(site: DemoSite) -> None:
    allowed = re.compile(scope_regex(site))
    p = site.port
    for o in site.origins:
        assert allowed.search(o + "/") and allowed.search(o + "/a/b.html?x=1")
    for url in (f"http://{OUTSIDE}:{p}/", f"http://127.0.0.1:{p}/", f"http://127.0.0.20:{p}/",
                f"http://127.0.0.2:{p + 1}/", f"http://127.0.0.2:{p}0/", f"https://127.0.0.2:{p}/",
                f"http://127.0.0.2.example.com:{p}/", f"http://x/?http://127.0.0.2:{p}/"):
        assert not allowed.search(url), url


def test_ctrl_c_stops_the_demo_and_says_where_its_crawl_is(tmp_path: Path) -> None:
    data = tmp_path / "d"
    proc = subprocess.Popen([sys.executable, "-m", "crawler", "demo", "--data", str(data)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        deadline = time.monotonic() + DEMO_TIMEOUT
        # settings.json is written once start handles Ctrl-C itself
        while not (data / "settings.json").exists() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        out, err = proc.communicate(timeout=DEMO_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"demo: interrupted; what it made so far is in {data} (" in err
    assert "crawl interrupted:" in out  # start's own summary, shown as it stopped
    assert "demo: wrote the report" not in out


@pytest.mark.parametrize("kind", ["a crawl", "a file"])
def test_data_that_is_not_new_or_empty_is_one_line_and_nothing_changes(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "d"
    if kind == "a file":
        data.write_text("mine")
    else:
        data.mkdir()
        (data / "seeds.txt").write_text("http://example.com/\n")
    before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    assert main(["demo", "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"crawler: error: --data {data}: ") and err.count("\n") == 1, err
    assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before


def test_the_site_answers_what_its_tables_say(site: DemoSite) -> None:
    """The site itself, over HTTP: robots.txt, the sitemap, a redirect, a 404, a page."""
    import http.client

    def get(number: int, path: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(HOSTS[number - 1], site.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    status, _, body = get(1, "/robots.txt")
    assert status == 200 and f"Disallow: {DISALLOWED}".encode() in body
    status, _, body = get(4, "/robots.txt")
    assert f"Sitemap: {origin(4, site.port)}/sitemap.xml".encode() in body
    status, _, body = get(4, "/sitemap.xml")
    assert status == 200 and all(f"<loc>{origin(4, site.port)}{p}</loc>".encode() in body
                                 for p in SITEMAPS[4])
    status, headers, _ = get(2, "/install")
    assert status == 301 and headers["Location"] == origin(2, site.port) + "/start.html"
    assert get(3, "/2023/gone.html")[0] == 404
    status, headers, body = get(1, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert f'href="{origin(2, site.port)}/"'.encode() in body
    assert [(h, p) for _, h, p in site.requests][:2] == [(HOSTS[0], "/robots.txt"),
                                                        (HOSTS[3], "/robots.txt")]
