"""The crawl report: its numbers against the test web's oracle (status counts, redirect
chains, broken links and their referrers, hosts, duplicates), the HTML in headless Chromium
(no console errors, every chart, a screenshot, nothing to fetch), and ``serve`` answering
over loopback while a crawl runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crawl_helpers import REPO, config_for, run_crawl

from crawler.cli import main
from crawler.outcomes import outcome_class, outcome_key
from crawler.read import _grouping as grouping
from crawler.read import report as report_mod
from crawler.read.listing import CrawlReader
from crawler.read.report import ERROR_CLASSES, TimeBins
from crawler.read.serve import ReportServer
from crawler.run.engine import Engine
from crawler.state.pages import PageRecord
from crawler.web.urls import host_of
from tools import system_packages
from tools.testweb import SiteConfig, TestWeb, fault
from tools.testweb.oracle import REDIRECTS
from tools.testweb.urls import split

CHROMIUM = "/usr/bin/chromium"
CHARTS = ("outcomes", "timeline", "hosts", "depth", "rank")
WAIT = 60.0  # seconds a condition may take on a loaded machine
MAX_REDIRECTS = 4  # the 10-hop chain of the redirects fault ends at a URL never fetched


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    faults = [fault("redirects"), fault("meta_robots"), fault("nxdomain"), fault("refused"),
              fault("status_500")]
    with TestWeb(SiteConfig(pages=160, hosts=3, seed=9, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("report") / "crawl"
        run_crawl(web, data, max_redirects=MAX_REDIRECTS)
        yield web, data


@pytest.fixture(scope="module")
def report(crawl: tuple[TestWeb, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("json") / "r.json"
    assert main(["report", str(crawl[1]), "--format", "json", "--out", str(out), "--limit",
                 "10000", "--referrers", "10000", "--quiet"]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def records(data: Path, *, body: bool = False) -> dict[str, PageRecord]:
    with CrawlReader(data) as reader:
        return {p.url: p for p in reader.pages(with_body=body)}


def test_status_counts_are_the_oracles(crawl: tuple[TestWeb, Path],
                                       report: dict[str, Any]) -> None:
    web, data = crawl
    want = web.oracle.crawl(max_redirects=MAX_REDIRECTS)
    expected = Counter(str(s) for s in want.status.values())
    expected["0"] = len(want.unreachable | want.blocked)
    assert report["outcomes"]["by_status"] == dict(expected)
    recs = records(data)
    assert report["crawl"]["records"] == len(recs) == sum(expected.values())
    assert report["crawl"]["fetched"] == len(want.fetched)
    assert report["outcomes"]["by_key"]["robots_disallowed"] == len(want.blocked)
    assert sum(report["outcomes"]["by_class"].values()) == len(recs)
    assert sum(int(n) for n in report["depth"].values()) == len(recs)
    bins = report["timeline"]["bins"]
    errors = sum(outcome_class(outcome_key(p.status, p.reason, p.truncated)) in ERROR_CLASSES
                 for p in recs.values())
    assert sum(b["pages"] for b in bins) == len(want.fetched)
    assert sum(b["errors"] for b in bins) == errors > 0


def test_hosts_table(crawl: tuple[TestWeb, Path], report: dict[str, Any]) -> None:
    web, data = crawl
    recs = records(data)
    want = web.oracle.crawl(max_redirects=MAX_REDIRECTS)
    got = {h["host"]: h for h in report["hosts"]["top"]}
    assert report["hosts"]["count"] == len(got) == len({host_of(u) for u in recs})
    for host, row in got.items():
        mine = [p for u, p in recs.items() if host_of(u) == host]
        assert row["pages"] == len(mine)
        assert row["robots_blocked"] == sum(host_of(u) == host for u in want.blocked)
        times = sorted(p.elapsed for p in mine if p.elapsed is not None)
        if times:
            mid = len(times) // 2
            median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
            assert row["median_fetch_s"] == pytest.approx(median, abs=1e-6)
        else:
            assert row["median_fetch_s"] is None
    assert got["nx.test"]["errors"] == got["nx.test"]["pages"] >= 1


def oracle_chains(web: TestWeb, recorded: set[str]) -> set[tuple[tuple[str, ...], Any, bool]]:
    """Every redirect chain from the site's own answers: (URLs, final status, loop)."""
    def location(url: str) -> str | None:
        node = web.oracle.describe(url)
        if node is None or node.status not in REDIRECTS or node.location is None:
            return None
        return node.location

    status = web.oracle.crawl(max_redirects=MAX_REDIRECTS).status
    redirects = {u: loc for u in recorded if (loc := location(u)) is not None}
    targets = set(redirects.values())
    heads = [u for u in redirects if u not in targets]
    seen: set[str] = set()
    out = set()

    def follow(url: str) -> tuple[tuple[str, ...], Any, bool]:
        path = [url]
        while True:
            seen.add(url)
            nxt = redirects[url]
            if nxt in path:
                return (*path, nxt), None, True
            path.append(nxt)
            if nxt not in recorded:
                return tuple(path), None, False
            if nxt not in redirects:
                return tuple(path), status.get(nxt, 0), False
            url = nxt

    for head in heads:
        out.add(follow(head))
    cycles = [u for u in redirects if u not in seen]
    while cycles:
        chain = follow(min(cycles))  # the report starts a headless cycle at its lowest rid
        out.add(chain)
        cycles = [u for u in redirects if u not in seen]
    return out


def test_redirect_chains_are_the_oracles(crawl: tuple[TestWeb, Path],
                                         report: dict[str, Any]) -> None:
    web, data = crawl
    recorded = set(records(data))
    r = report["redirects"]
    want = oracle_chains(web, recorded)
    # A headless loop may start at any of its members: compare loops as sets of URLs.
    got = {(tuple(c["urls"]), c["final_status"], c["loop"]) for c in r["list"]}
    norm = {(frozenset(u) if loop else u, s, loop) for u, s, loop in got}
    assert norm == {(frozenset(u) if loop else u, s, loop) for u, s, loop in want}
    assert r["chains"] == len(want) == len(r["list"])
    assert r["loops"] == sum(loop for *_, loop in want) >= 1
    for c in r["list"]:
        assert c["long"] == (c["hops"] > 3)
        assert c["hops"] == len(c["urls"]) - 1
    assert r["long"] >= 1  # the redirects fault's chain, cut by --max-redirects 4: 5 hops
    assert any(c["final_status"] is None and not c["loop"] for c in r["list"])
    assert r["list"][0]["long"] or r["list"][0]["loop"]  # findings first


def test_broken_links_and_their_referrers_are_the_oracles(
    crawl: tuple[TestWeb, Path], report: dict[str, Any]
) -> None:
    web, data = crawl
    recs = records(data)
    want = web.oracle.crawl(max_redirects=MAX_REDIRECTS)
    broken = {u for u, s in want.status.items() if s >= 400} | set(want.unreachable)
    referrers: dict[str, set[str]] = {u: set() for u in broken}
    for url in recs:
        node = web.oracle.describe(url)
        if url not in want.fetched or node is None:
            continue
        if node.status in REDIRECTS and node.location in referrers:
            referrers[node.location].add(url)
        elif node.status == 200 and node.html:
            for link in set(node.links) & broken:
                referrers[link].add(url)
    linked = {u: refs for u, refs in referrers.items() if refs}
    got = {t["url"]: t for t in report["broken"]["list"]}
    assert set(got) == set(linked)
    for url, t in got.items():
        assert {f["url"] for f in t["from"]} == linked[url] and t["referrers"] == len(linked[url])
        assert t["status"] == want.status.get(url, 0)
    assert report["broken"]["links"] == sum(len(r) for r in linked.values())
    assert any(t["status"] == 404 for t in got.values())
    assert any(t["reason"] == "dns_nxdomain" for t in got.values())
    assert any(t["status"] == 500 for t in got.values())


def test_duplicates_slowest_largest_and_rank(crawl: tuple[TestWeb, Path],
                                             report: dict[str, Any]) -> None:
    web, data = crawl
    recs = records(data, body=True)
    groups: dict[str, list[str]] = {}
    for url, p in recs.items():
        if p.status == 200 and p.body and not p.truncated:
            t = split(url)
            assert t is not None
            node = web.site.lookup(t.host, t.target)
            groups.setdefault(hashlib.sha1(web.site.body(t.host, node)).hexdigest(), []).append(
                url)
    dups = [sorted(g) for g in groups.values() if len(g) > 1]
    d = report["duplicates"]
    assert d["groups"] == len(dups) > 0 and d["pages"] == sum(len(g) for g in dups)
    assert sorted(sorted(g["urls"]) for g in d["top"]) == sorted(dups)
    timed = sorted((p.elapsed for p in recs.values() if p.elapsed is not None), reverse=True)
    assert [r["elapsed"] for r in report["slowest"]] == timed
    assert report["largest"][0]["bytes"] == max(len(p.body) for p in recs.values())
    rank = report["rank"]
    assert rank["computed"] and rank["converged"] and rank["top"][0]["rank_scaled"] == 100.0
    assert len(rank["top"]) == len(web.oracle.crawl(max_redirects=MAX_REDIRECTS).fetched)
    assert abs(sum(t["rank"] for t in rank["top"]) - 1) < 1e-6


def test_oversized_buckets_are_grouped_in_chunks(
    crawl: tuple[TestWeb, Path], report: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host (or a payload) whose rows pass MAX_EXACT_ROWS is grouped chunk by chunk:
    the same counts, medians within the histogram's 0.5%."""
    monkeypatch.setattr(grouping, "MAX_EXACT_ROWS", 5)
    chunked = report_mod.compute(str(crawl[1]), limit=10_000, referrers=10_000, rank=False,
                                 chunk=7)
    assert chunked["duplicates"] == report["duplicates"]
    want = {h["host"]: h for h in report["hosts"]["top"]}
    assert chunked["hosts"]["count"] == report["hosts"]["count"]
    for h in chunked["hosts"]["top"]:
        w = want[h["host"]]
        assert {k: h[k] for k in h if k != "median_fetch_s"} == {
            k: w[k] for k in w if k != "median_fetch_s"}
        if w["median_fetch_s"] is None:
            assert h["median_fetch_s"] is None
        else:
            assert h["median_fetch_s"] == pytest.approx(w["median_fetch_s"], rel=0.011)


def test_time_bins_stay_bounded() -> None:
    bins = TimeBins(max_bins=10)
    for t in range(1000):
        bins.add(1.7e9 + t, 1, t % 2)
    rows = bins.rows()
    assert len(rows) <= 10 and sum(r["pages"] for r in rows) == 1000
    assert sum(r["errors"] for r in rows) == 500 and bins.width == 128


# -- the HTML in a browser ----------------------------------------------------------------


def chromium(tmp: Path, target: str, *extra: str) -> tuple[str, str]:
    """Headless Chromium on ``target`` (no network: every host resolves to nothing, no
    proxy to reach); returns (stdout, the console messages it logged)."""
    why = system_packages.missing("chromium")  # /usr/bin/chromium, CHROMIUM
    if why is not None:
        pytest.skip(why)  # a failure in CI (tests/conftest.py)
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", *extra,
           target]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, "\n".join(console)


def test_the_console_check_sees_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom'); nope();</script>")
    _, console = chromium(tmp_path, bad.as_uri(), "--dump-dom")
    assert "boom" in console and "nope is not defined" in console


def test_html_report_in_headless_chromium(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    _, data = crawl
    out = tmp_path / "report.html"
    assert main(["report", str(data), "--out", str(out), "--quiet"]) == 0
    dom, console = chromium(tmp_path, out.as_uri(), "--dump-dom")
    assert console == ""
    # Self-contained: nothing refers outside the page, in the DOM as the browser parsed it
    # (attributes serialized in double quotes; SVG namespaces are names, not fetches).
    refs = re.findall(r'\s(?:src|href|srcset|action|data|poster|xlink:href)="([^"]*)"', dom)
    assert refs and all(r.startswith("#") for r in refs), [r for r in refs if r[:1] != "#"]
    assert not re.search(r"<(?:script|link|img|iframe|object|embed|audio|video)\b", dom)
    assert "@import" not in dom
    assert all(u.startswith("#") for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", dom))
    for name in CHARTS:
        m = re.search(rf'<figure id="chart-{name}" class="chart"><svg[^>]*>(.*?)</svg>', dom,
                      re.S)
        assert m is not None and "<path" in m.group(1), name
    for section in ("hosts", "redirects", "broken", "duplicates", "slowest", "largest"):
        assert f'<section id="{section}">' in dom
    shot = tmp_path / "report.png"
    chromium(tmp_path, out.as_uri(), f"--screenshot={shot}", "--window-size=1200,3000",
             "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    keep = os.environ.get("KVCRAWL_REPORT_SCREENSHOT")  # to look at it: a path to copy it to
    if keep:
        shutil.copy(shot, keep)


def test_missing_matplotlib_is_one_clear_line(crawl: tuple[TestWeb, Path],
                                              tmp_path: Path) -> None:
    _, data = crawl
    code = ("import sys; sys.modules['matplotlib'] = None; from crawler.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for fmt, rc in (("html", 1), ("json", 0)):
        done = subprocess.run([sys.executable, "-c", code, "report", str(data), "--format",
                               fmt, "--out", str(tmp_path / f"r.{fmt}"), "--quiet"],
                              cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == rc, done.stderr
        if rc:
            assert done.stderr.count("\n") == 1
            assert done.stderr.startswith("crawler: error: ") and "kvcrawl[report]" in done.stderr


@pytest.mark.parametrize("command", ["links", "rank", "report", "serve"])
def test_each_command_has_help_with_an_example_and_is_documented(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    assert "example: python -m crawler " + command in capsys.readouterr().out
    assert f"python -m crawler {command} DIR" in (REPO / "docs" / "REPORT.md").read_text()


@pytest.mark.parametrize("argv", [["report", "d", "--limit", "0"], ["report", "d", "--format",
                                  "xml"], ["serve", "d", "--port", "70000"],
                                  ["serve", "d", "--interval", "0"]])
def test_report_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


# -- serve -----------------------------------------------------------------------------------


def get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback only
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_serve_answers_while_a_crawl_runs(make_testweb: Any, tmp_path: Path) -> None:
    web = make_testweb(pages=300, hosts=2, seed=1, crawl_delay=0.0)
    data = tmp_path / "live"
    engine = Engine(config_for(web, data, threads=2, per_host=1, delay=0.05))
    engine.add_seeds([web.seed_url])
    crawler = threading.Thread(target=engine.run, name="crawl", daemon=True)
    crawler.start()
    server = None
    try:
        wait_for(lambda: (data / "main").exists() and _records(data) > 0, "a first record")
        server = ReportServer(str(data), port=0, interval=0.1, refresh=3, rank=False).start()
        assert server.address[0] == "127.0.0.1"
        assert server.wait_ready(WAIT)
        seen = []
        for _ in range(2):  # two reports, each of more records, the crawl still running
            wait_for(lambda: server.computations > len(seen), "a new report")
            status, ctype, body = get(server.url + "report.json")
            assert status == 200 and ctype == "application/json"
            seen.append(json.loads(body)["crawl"]["records"])
            assert crawler.is_alive(), "the crawl ended before the report was served"
        assert seen[1] > seen[0] > 0
        status, ctype, body = get(server.url)
        assert status == 200 and ctype.startswith("text/html")
        assert b'<meta http-equiv="refresh" content="3">' in body and b'id="chart-hosts"' in body
        assert get(server.url + "nope")[0] == 404
        assert get(server.url, method="POST")[0] == 405
    finally:
        if server is not None:
            server.stop()
        engine.stop()
        crawler.join(timeout=WAIT)


def _records(data: Path) -> int:
    with CrawlReader(data) as reader:
        return len(reader)


def test_serve_command_on_loopback(crawl: tuple[TestWeb, Path]) -> None:
    _, data = crawl
    proc = subprocess.Popen([sys.executable, "-m", "crawler", "serve", str(data), "--port", "0",
                             "--no-rank"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert m is not None, line
        wait_for(lambda: b"<svg" in get(m.group(1))[2], "the report page")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT) == 0
        assert proc.stdout is not None
        proc.stdout.close()
