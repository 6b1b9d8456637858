"""``python -m crawler export --warc``: a testweb crawl read back with warcio, checked by
``warcio check``, against what the server served; split files, a running crawl, damage."""

from __future__ import annotations

import logging
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from crawl_helpers import cli_args, records, run_crawl, start_cli
from warcio.archiveiterator import ArchiveIterator

import kvstore
from crawler.cli import main
from crawler.net.fetch import Fetcher
from crawler.read.export import request_headers
from crawler.read.listing import CrawlReader, iso_time
from crawler.state.pages import PageRecord, encode_page
from crawler.web.urls import url_key
from tools.testweb import SiteConfig, TestWeb, fault

REVISIT_PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"


@dataclass
class Rec:
    type: str
    headers: dict[str, str]
    status: int | None
    http: dict[str, str]  # HTTP headers, names lowercase
    payload: bytes


def read_warc(path: Path) -> list[Rec]:
    out = []
    with open(path, "rb") as f:
        for r in ArchiveIterator(f):
            http = {}
            status = None
            if r.http_headers is not None and r.rec_type in ("response", "revisit"):
                status = int(r.http_headers.get_statuscode())
            if r.http_headers is not None:
                http = {k.lower(): v for k, v in r.http_headers.headers}
            out.append(Rec(r.rec_type, dict(r.rec_headers.headers), status, http,
                           r.raw_stream.read()))
    return out


def warcio_check(*paths: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "warcio.cli", "check", "-v", *map(str, paths)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "digest pass" in done.stdout
    return done.stdout


def served_body(web: TestWeb, url: str) -> bytes:
    host = web.site.served_by(url)
    node = web.oracle.describe(url)
    assert host is not None and node is not None, url
    return web.site.body(host[0].name, node)


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    faults = [fault("binary"), fault("redirects"), fault("gzip_bomb", size=4 << 20),
              fault("huge_body", size=3 << 20), fault("refused")]
    with TestWeb(SiteConfig(pages=60, hosts=3, seed=0, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("warc") / "crawl"
        engine = run_crawl(web, data, max_decoded_bytes=1 << 20, max_body_bytes=2 << 20)
        assert engine.complete  # type: ignore[attr-defined]
        yield web, data


@pytest.fixture(scope="module")
def exported(crawl: tuple[TestWeb, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "crawl.warc.gz"
    assert main(["export", str(crawl[1]), "--warc", str(out), "--quiet"]) == 0
    return out


def full_records(data: Path) -> dict[str, PageRecord]:
    with CrawlReader(data) as reader:
        return {p.url: p for p in reader.pages()}


def test_every_page_is_in_the_warc_and_warcio_check_passes(
    crawl: tuple[TestWeb, Path], exported: Path
) -> None:
    web, data = crawl
    warcio_check(exported)
    recs = read_warc(exported)
    info = recs[0]
    assert info.type == "warcinfo"
    assert info.headers["WARC-Filename"] == exported.name
    assert b"isPartOf: crawl" in info.payload
    assert all(r.headers["WARC-Warcinfo-ID"] == info.headers["WARC-Record-ID"] for r in recs[1:])
    pages = full_records(data)
    by_uri: dict[str, list[Rec]] = {}
    for r in recs[1:]:
        by_uri.setdefault(r.headers["WARC-Target-URI"], []).append(r)
    assert set(by_uri) == set(pages)
    ids = {r.headers["WARC-Record-ID"]: r for r in recs}
    compared = 0
    for url, page in pages.items():
        got = by_uri[url]
        date = iso_time(page.fetched_at)
        assert all(r.headers["WARC-Date"] == date for r in got)
        if page.status == 0:
            assert [r.type for r in got] == ["metadata"]
            assert f"outcome: {page.reason}".encode() in got[0].payload
            continue
        assert sorted(r.type for r in got) in (["request", "response"], ["request", "revisit"])
        resp = next(r for r in got if r.type != "request")
        req = next(r for r in got if r.type == "request")
        assert ids[req.headers["WARC-Concurrent-To"]] is resp
        assert resp.status == page.status
        assert resp.headers["WARC-IP-Address"] == req.headers["WARC-IP-Address"] == page.ip
        assert req.http["host"] == url.split("/")[2]
        if resp.type == "response":
            assert resp.payload == page.body
            assert int(resp.http["content-length"]) == len(page.body)
        if page.status == 200 and page.body and not page.truncated:
            assert page.body == served_body(web, url)  # what the server sent, decoded
            compared += 1
    assert compared >= 60


def test_decoded_and_missing_bodies_have_consistent_headers(
    crawl: tuple[TestWeb, Path], exported: Path
) -> None:
    web, data = crawl
    pages = full_records(data)
    resp = {r.headers["WARC-Target-URI"]: r for r in read_warc(exported) if r.type == "response"}
    bomb = resp[web.url("h0.test", "/x/gzip_bomb/1")]
    assert "content-encoding" not in bomb.http
    assert bomb.http["x-crawler-original-content-encoding"] == "gzip"
    assert bomb.payload == b" " * (1 << 20)  # decoded, cut at max_decoded_bytes
    assert bomb.http["content-length"] == str(1 << 20)
    assert int(bomb.http["x-crawler-original-content-length"]) < 10_000  # the gzip bytes
    assert bomb.headers["WARC-Truncated"] == "length"
    huge_url = web.url("h0.test", "/x/huge_body/1")
    huge = resp[huge_url]
    assert huge.headers["WARC-Truncated"] == "length"
    assert 0 < len(huge.payload) < 3 << 20 and huge.payload == pages[huge_url].body
    assert huge.http["x-crawler-original-content-length"] == str(3 << 20)
    image = resp[web.url("h0.test", "/x/binary/image")]  # fetched, body not kept: not HTML
    assert image.status == 200 and image.payload == b""
    assert image.headers["WARC-Truncated"] == "unspecified"
    assert image.http["x-crawler-reason"] == "not_html"
    assert image.http["content-type"] == "image/png"
    assert int(image.http["x-crawler-original-content-length"]) > 0
    moved = resp[web.url("h0.test", "/x/redirects/to-host")]
    assert moved.status == 301 and moved.http["location"] == web.url("h1.test", "/")
    assert "WARC-Truncated" not in moved.headers  # Content-Length: 0 was sent
    page = resp[web.url("h0.test", "/")]
    assert "WARC-Truncated" not in page.headers and "x-crawler-reason" not in page.http


def test_repeated_payloads_are_revisits_of_an_earlier_response(
    crawl: tuple[TestWeb, Path], exported: Path, tmp_path: Path
) -> None:
    recs = read_warc(exported)
    seen: dict[str, Rec] = {}
    revisits = 0
    for r in recs:
        if r.type == "response" and r.status == 200 and r.payload:
            seen.setdefault(r.headers["WARC-Payload-Digest"], r)
        if r.type != "revisit":
            continue
        revisits += 1
        original = seen[r.headers["WARC-Payload-Digest"]]  # earlier in the file
        assert r.headers["WARC-Profile"] == REVISIT_PROFILE
        assert r.headers["WARC-Refers-To"] == original.headers["WARC-Record-ID"]
        assert r.headers["WARC-Refers-To-Target-URI"] == original.headers["WARC-Target-URI"]
        assert r.headers["WARC-Refers-To-Date"] == original.headers["WARC-Date"]
        assert r.status == 200 and r.payload == b""
    # The site serves ?v=1 / ?v=2 variants with their page's bytes.
    assert revisits >= 5
    full = tmp_path / "full.warc.gz"
    assert main(["export", str(crawl[1]), "--warc", str(full), "--no-revisits", "--quiet"]) == 0
    again = read_warc(full)
    assert not [r for r in again if r.type == "revisit"]
    assert sum(r.type == "response" for r in again) == sum(
        r.type in ("response", "revisit") for r in recs)


def test_request_records_are_what_the_fetcher_sends() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    heads: list[bytes] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            heads.append(data)
            conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve)
    thread.start()
    url = f"http://a.test:{port}/p/q.html?x=1&y=%C3%A9"
    with Fetcher(user_agent="probe/1.0", resolve=lambda host: "127.0.0.1") as fetcher:
        assert fetcher.fetch(url).status == 204
    thread.join(10)
    server.close()
    sent = heads[0].decode("latin-1").split("\r\n")[:-2]
    ours = request_headers(url, "probe/1.0").to_str().split("\r\n")[:-1]
    assert ours[0] == sent[0] == "GET /p/q.html?x=1&y=%C3%A9 HTTP/1.1"
    assert sorted(ours[1:]) == sorted(sent[1:])


def test_split_by_size_gives_whole_files_with_whole_pairs(
    crawl: tuple[TestWeb, Path], exported: Path, tmp_path: Path
) -> None:
    limit = 64 << 10
    assert main(["export", str(crawl[1]), "--warc", str(tmp_path / "part.warc.gz"),
                 "--max-size", "64K", "--quiet"]) == 0
    files = sorted(tmp_path.glob("part-*.warc.gz"))
    assert [f.name for f in files] == [f"part-{i:05d}.warc.gz" for i in range(len(files))]
    assert len(files) >= 3
    assert not list(tmp_path.glob("*.part"))
    warcio_check(*files)
    merged: list[Rec] = []
    for i, f in enumerate(files):
        recs = read_warc(f)
        assert recs[0].type == "warcinfo" and recs[0].headers["WARC-Filename"] == f.name
        if i < len(files) - 1:
            assert f.stat().st_size >= limit  # a new file only once the limit is reached
        ids = {r.headers["WARC-Record-ID"] for r in recs}
        for r in recs:
            if r.type == "request":
                assert r.headers["WARC-Concurrent-To"] in ids  # the pair is in one file
        merged += recs[1:]
    whole = read_warc(exported)[1:]
    key = Counter((r.type, r.headers["WARC-Target-URI"]) for r in whole)
    assert Counter((r.type, r.headers["WARC-Target-URI"]) for r in merged) == key


def test_progress_lines_and_summary(
    crawl: tuple[TestWeb, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="crawler.read.export")
    out = tmp_path / "p.warc"
    assert main(["export", str(crawl[1]), "--warc", str(out), "--progress-interval", "0"]) == 0
    n = len(records(crawl[1]))
    messages = [r.getMessage() for r in caplog.records if r.name == "crawler.read.export"]
    assert sum(m.startswith("export: ") for m in messages) == n
    assert f"export: {n} of {n} pages (100%)" in messages[-2]
    summary = messages[-1]
    assert summary.startswith(f"exported {n} pages")
    assert f"{out.stat().st_size} bytes in 1 file(s)" in summary
    assert read_warc(out)[0].type == "warcinfo"  # plain WARC: the name has no .gz


def test_export_while_the_crawl_is_running_is_a_consistent_snapshot(
    tmp_path: Path,
) -> None:
    config = SiteConfig(pages=400, hosts=3, seed=1, crawl_delay=0.0)
    with TestWeb(config) as web:
        data = tmp_path / "live"
        proc = start_cli(cli_args(web, data, "--per-host", "1", "--delay", "0.05"))
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                try:
                    with kvstore.open(data / "main", readonly=True) as main_db:
                        if len(main_db) >= 30:
                            break
                except kvstore.exceptions.StoreNotFoundError:  # not created yet
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.05)
            out = tmp_path / "live.warc.gz"
            assert main(["export", str(data), "--warc", str(out), "--quiet"]) == 0
            assert proc.poll() is None  # the export ran beside the writer
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        warcio_check(out)
        final = full_records(data)
        got = [r for r in read_warc(out)[1:] if r.type != "request"]
        assert 30 <= len(got) <= len(final)
        for r in got:
            page = final[r.headers["WARC-Target-URI"]]  # every exported page is in the crawl,
            assert r.headers["WARC-Date"] == iso_time(page.fetched_at)  # the same record
            if r.type == "response":
                assert r.payload == page.body


def _store_with_damage(data: Path) -> tuple[list[str], str]:
    """A crawl's main/ with good pages, one whose bytes rot on disk and one that is not
    a page record. Padding after the rotten one keeps it out of the tail that kvstore
    checks on open (there it would be cut off instead of failing its CRC on read)."""
    good = [f"http://a.test/{i}" for i in range(4)]
    rotten = "http://a.test/rotten"
    data.mkdir()
    with kvstore.open(data / "main") as db:
        db[url_key(good[0])] = encode_page(PageRecord(good[0], 200, 1.7e9, 0, body=b"<p>a"))
        db[url_key(rotten)] = encode_page(PageRecord(rotten, 200, 1.7e9, 0, body=b"<p>b"))
        for i, url in enumerate(good[1:]):
            body = random.Random(i).randbytes(800_000)  # incompressible
            db[url_key(url)] = encode_page(
                PageRecord(url, 200, 1.7e9, 1, content_type="image/png", body=body))
        db[url_key("http://a.test/garbage")] = b"not a page record"
    (val,) = (data / "main").glob("*.val")
    raw = bytearray(val.read_bytes())
    at = raw.index(rotten.encode())
    raw[at] ^= 0x20
    val.write_bytes(bytes(raw))
    return good, rotten


def test_damaged_records_are_skipped_with_a_warning_or_stop_a_strict_export(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "damaged"
    good, rotten = _store_with_damage(data)
    out = tmp_path / "d.warc.gz"
    caplog.set_level(logging.INFO)
    assert main(["export", str(data), "--warc", str(out)]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert any(url_key(rotten).hex() in w and "CRC" in w for w in warnings)
    assert any(url_key("http://a.test/garbage").hex() in w for w in warnings)
    assert "2 damaged record(s) skipped" in caplog.records[-1].getMessage()
    warcio_check(out)
    uris = {r.headers.get("WARC-Target-URI") for r in read_warc(out)[1:]}
    assert uris == set(good)

    strict = tmp_path / "s.warc.gz"
    capsys.readouterr()
    assert main(["export", str(data), "--warc", str(strict), "--strict"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crawler: error: ") and "is damaged" in err
    assert not strict.exists() and not list(tmp_path.glob("s.warc.gz*"))


def test_memory_stays_flat_whatever_the_crawl_size(tmp_path: Path) -> None:
    """48 pages of 512 KiB: a pass that kept pages (or bodies) would hold 24 MiB; a
    streaming one holds about one record (its stored, compressed and decoded copies)."""
    data = tmp_path / "big"
    data.mkdir()
    size, n = 512 << 10, 48
    with kvstore.open(data / "main") as db:
        for i in range(n):
            url = f"http://a.test/{i}.html"
            body = random.Random(i).randbytes(size)
            db[url_key(url)] = encode_page(
                PageRecord(url, 200, 1.7e9 + i, 0, content_type="text/html", body=body))
    tracemalloc.start()
    try:
        assert main(["export", str(data), "--warc", str(tmp_path / "b.warc.gz"),
                     "--jsonl", str(tmp_path / "b.jsonl"), "--quiet"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * size, peak  # 6 MiB
    assert sum(r.type == "response" for r in read_warc(tmp_path / "b.warc.gz")) == n
