"""tools/seedscale.py: a synthetic crawl built through the frontier, read back by the
crawler's own readers (status, its counters and --recount, the stores, a resume)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kvstore
from crawler.outcomes import by_class
from crawler.state.pages import decode_bulk, decode_page
from crawler.state.shards import owner, shard_dir
from crawler.web.urls import host_of, normalize, url_key
from tools.testweb.dnsserver import DNSServer

REPO = Path(__file__).resolve().parents[2]
PAGES, PENDING, HOSTS, SHARDS = 3000, 4000, 700, 2


def run(*args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def build(data: Path, *extra: str) -> dict[str, Any]:
    out = run("tools/seedscale.py", "--pages", str(PAGES), "--pending", str(PENDING),
              "--hosts", str(HOSTS), "--shards", str(SHARDS), "--data", str(data), "--quiet",
              *extra)
    summary: dict[str, Any] = json.loads(out)
    return summary


def status(data: Path, *flags: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(run("-m", "crawler", "status", str(data), "--json",
                                          *flags))
    return info


def records(data: Path, shard: int) -> dict[bytes, bytes]:
    with kvstore.open(os.path.join(shard_dir(str(data), shard, SHARDS), "main"),
                      readonly=True) as db:
        return {k: db[k] for k in db}


def pending_urls(data: Path, shard: int) -> list[str]:
    with kvstore.open(os.path.join(shard_dir(str(data), shard, SHARDS), "pend"),
                      readonly=True) as db:
        return [e.url for k in db for e in decode_bulk(db[k])]


class _Pages(http.server.BaseHTTPRequestHandler):
    """Every path a small HTML page (robots.txt too: no rules in it)."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<html><body><a href='/next.html'>next</a></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def built(tmp_path: Path, web: http.server.ThreadingHTTPServer) -> tuple[Path, dict[str, Any]]:
    data = tmp_path / "crawl"
    return data, build(data, "--port", str(web.server_address[1]))


def test_status_counts_are_what_was_built(built: tuple[Path, dict[str, Any]]) -> None:
    data, summary = built
    assert summary["recorded"] == PAGES and summary["pending"] == PENDING
    fast, slow = status(data), status(data, "--recount")
    assert fast["counts_from"] == "counters"
    assert {k: v for k, v in fast.items() if k != "counts_from"} == {
        k: v for k, v in slow.items() if k != "counts_from"}
    assert slow["recorded"] == PAGES and slow["pending"] == PENDING
    assert slow["outcomes"] == summary["outcomes"]
    assert slow["classes"] == by_class(summary["outcomes"]) == summary["classes"]
    # a broad crawl's mix: mostly 200, then redirects and 4xx, and failures of each kind
    classes = slow["classes"]
    assert classes["ok"] > PAGES * 0.6
    for cls in ("redirect", "http_4xx", "robots", "dns"):
        assert classes.get(cls, 0) > 0, cls
    per_shard = [s["recorded"] for s in slow["per_shard"]]
    assert per_shard == [s["recorded"] for s in summary["per_shard"]]
    assert all(n > 0 for n in per_shard)


def test_records_are_in_their_hosts_shard_and_links_resolve(
        built: tuple[Path, dict[str, Any]]) -> None:
    data, _ = built
    stored = [records(data, s) for s in range(SHARDS)]
    pending = [pending_urls(data, s) for s in range(SHARDS)]
    known = {k for shard in stored for k in shard} | {url_key(u) for p in pending for u in p}
    assert len(known) == PAGES + PENDING
    linked: set[bytes] = set()
    counts = []
    for s in range(SHARDS):
        for u in pending[s]:
            assert owner(host_of(u), SHARDS) == s, u
        for key, value in stored[s].items():
            page = decode_page(value)
            assert normalize(page.url) == page.url and url_key(page.url) == key
            assert owner(host_of(page.url), SHARDS) == s, page.url
            targets = page.link_keys()
            assert set(targets) <= known, page.url
            linked.update(targets)
            if page.status == 200 and page.body:
                counts.append(len(targets))
                assert page.outlinks <= len(targets)
            if page.redirect:
                assert page.redirect_key() in known
    assert len(counts) > PAGES * 0.6
    assert 20 <= sum(counts) / len(counts) <= 45  # 20-40 drawn, a few repeats on small hosts
    # every pending URL was found somewhere: some page lists it
    assert {url_key(u) for p in pending for u in p} <= linked


def test_same_seed_same_records(tmp_path: Path,
                                built: tuple[Path, dict[str, Any]]) -> None:
    data, summary = built
    again = tmp_path / "again"
    assert build(again, "--port", str(summary_port(data)))["outcomes"] == summary["outcomes"]
    for s in range(SHARDS):
        assert records(again, s) == records(data, s)


def summary_port(data: Path) -> int:
    seed = (data / "seeds.txt").read_text().split()[0]
    return int(seed.split(":")[2].split("/")[0])


def test_a_crawl_resumes_on_it(built: tuple[Path, dict[str, Any]]) -> None:
    """start --data DIR alone (its saved settings, its seeds) fetches from the pending
    URLs; loopback only: the names resolve to 127.0.0.1, where the test web answers."""
    data, _ = built
    names = {f"h{i}.test": "127.0.0.1" for i in range(HOSTS)}
    with DNSServer(names) as dns:
        run("-m", "crawler", "start", "--data", str(data), "--max-pages", "3", "--quiet",
            "--nameserver", f"127.0.0.1:{dns.port}", "--allow-private-ips", "--sitemaps", "off",
            timeout=120)
    after = status(data)
    assert after["counts_from"] == "counters"
    assert after["recorded"] > PAGES and after["pending"] >= PENDING - 3 * SHARDS
    assert after == {**status(data, "--recount"), "counts_from": "counters"}
