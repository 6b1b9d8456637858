"""``python -m crawler export --warc``: a testweb crawl read back with warcio, checked by
``warcio check``, against what the server served; split files, a running crawl, damage."""

from __future__ import annotations

import logging
import os
import random
import resource
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
from crawl_helpers import cli_args, read_lines, records, run_crawl, start_cli, wait_for
from test_page_records import CUT, DOM, PLAIN, RENDERED, pages, rendered_crawl
from test_page_records import page as rendered_page
from test_progress import assert_complete, export_cli, listed_files, progress_lines, wrote_lines
from warcio.archiveiterator import ArchiveIterator

import kvstore
from crawler.cli import main
from crawler.net.fetch import Fetcher
from crawler.read.export import payload_digest, request_headers
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


def test_every_file_is_named_and_progress_reaches_every_record(
    crawl: tuple[TestWeb, Path], exported: Path, tmp_path: Path
) -> None:
    """The CLI as a user runs it: each file is logged when finished with its records and
    bytes, the last stdout line lists exactly the files on disk, warcio reads each, and
    the progress lines count every record, in order, up to 100%."""
    n = len(records(crawl[1]))
    done = export_cli(str(crawl[1]), "--warc", str(tmp_path / "part.warc.gz"), "--max-size",
                      "64K", "--progress-interval", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    on_disk = sorted(str(p) for p in tmp_path.iterdir())
    assert len(on_disk) >= 3
    assert listed_files(done.stdout) == on_disk == [
        str(tmp_path / f"part-{i:05d}.warc.gz") for i in range(len(on_disk))]
    wrote = wrote_lines(done.stderr)
    assert [path for path, _, _ in wrote] == on_disk  # each named once, in order
    warcio_check(*map(Path, on_disk))
    for path, count, size in wrote:
        assert count == len(read_warc(Path(path))) and size == Path(path).stat().st_size
    total = sum(count for _, count, _ in wrote)
    assert total == len(read_warc(exported)) - 1 + len(wrote)  # a warcinfo per file
    summary = done.stderr.strip().splitlines()[-1]
    assert f"WARC: {total} records" in summary and f"in {len(wrote)} file(s)" in summary
    lines = progress_lines(done.stderr)
    assert_complete(lines, n)
    assert [d for _, d, _, _ in lines] == list(range(1, n + 1))  # interval 0: every record
    text = done.stderr
    assert text.index("export: 100%") < text.index(f"export: wrote {on_disk[-1]}")


@pytest.mark.parametrize("max_size", [None, "1G"])
def test_output_names_depend_on_the_options_only(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    max_size: str | None,
) -> None:
    """Without --max-size the WARC has exactly the name given; with it the files are
    numbered even when one file results (so a script knows the names in advance)."""
    out = tmp_path / "crawl1.warc.gz"
    split = ["--max-size", max_size] if max_size else []
    assert main(["export", str(crawl[1]), "--warc", str(out), *split, "--quiet"]) == 0
    want = tmp_path / ("crawl1-00000.warc.gz" if max_size else "crawl1.warc.gz")
    assert capsys.readouterr().out == f"wrote {want}\n"
    assert sorted(tmp_path.iterdir()) == [want]
    warcio_check(want)


def test_names_with_spaces_are_listed_so_a_shell_reads_them_back(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "my crawl.warc"
    assert main(["export", str(crawl[1]), "--warc", str(out), "--quiet"]) == 0
    assert listed_files(capsys.readouterr().out) == [str(out)]
    assert read_warc(out)[0].type == "warcinfo"  # plain WARC: the name has no .gz


def _unwritable(tmp_path: Path) -> list[tuple[str, str]]:
    """(output path, the end of the one-line error) for outputs a user may give."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir.warc.gz").mkdir()
    return [
        (str(tmp_path / "missing" / "x.warc.gz"),
         f"the directory {tmp_path / 'missing'} does not exist: create it first"),
        (str(tmp_path / "a-file" / "x.warc.gz"), f"{tmp_path / 'a-file'} is a file, not a "
                                                 "directory"),
        (str(tmp_path / "a-dir.warc.gz"), "is a directory: give a file name"),
        # sysfs refuses new files even to root (a chmod'ed directory does not stop root)
        ("/sys/kvcrawl-test.warc.gz", "permission denied: write somewhere you may"),
    ]


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_nothing(
    crawl: tuple[TestWeb, Path], tmp_path: Path
) -> None:
    cases = _unwritable(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for path, hint in cases:
        for split in ([], ["--max-size", "64K"]):
            done = export_cli(str(crawl[1]), "--warc", path, *split)
            shown = path if not split or path.endswith("dir.warc.gz") else path.replace(
                ".warc.gz", "-00000.warc.gz")
            if split and path.endswith("dir.warc.gz"):  # the numbered name is free
                assert done.returncode == 0, done.stderr
                for f in listed_files(done.stdout):
                    os.unlink(f)
                continue
            assert done.returncode == 1, (path, done.stderr)
            assert done.stderr == f"crawler: error: cannot write the export: {shown}: {hint}\n"
            assert done.stdout == ""
    assert sorted(tmp_path.rglob("*")) == before  # no .part, no file


def _store_with_a_big_page(data: Path, *, small: int = 20, after: int = 6) -> None:
    """Pages of 8 KiB and one of 1 MiB that the pass meets after ``after`` small ones
    (store order is the index's, so the big key is picked until it lands there)."""
    data.mkdir()
    with kvstore.open(data / "main") as db:
        for i in range(small):
            url = f"http://a.test/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(
                url, 200, 1.7e9, 0, content_type="text/html",
                body=random.Random(i).randbytes(8 << 10)))
        for j in range(200):
            url = f"http://a.test/big{j}.html"
            key = url_key(url)
            db[key] = encode_page(PageRecord(url, 200, 1.7e9, 0, content_type="text/html",
                                             body=random.Random(-1).randbytes(1 << 20)))
            if list(db).index(key) >= after:
                return
            del db[key]
    raise AssertionError("no key landed late enough")


def test_a_failure_midway_removes_every_file_already_written(tmp_path: Path) -> None:
    """A file size limit plays the full disk: the export stops partway, after several
    split files were finished; it exits 1 with one line, and removes them all."""
    limit = 512 << 10  # the 1 MiB page cannot fit

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    data = tmp_path / "crawl"
    _store_with_a_big_page(data)
    out = tmp_path / "out" / "p.warc"
    out.parent.mkdir()
    args = [sys.executable, "-m", "crawler", "export", str(data), "--warc", str(out),
            "--max-size", "16K"]
    proc = start_cli(args, preexec_fn=small_files)
    stdout, stderr = (b.decode() for b in proc.communicate(timeout=120))
    assert proc.returncode == 1, stderr[-3000:]
    wrote = [path for path, _, _ in wrote_lines(stderr)]
    assert len(wrote) >= 2, stderr[-3000:]  # the failure came after finished files
    error = stderr.strip().splitlines()[-1]
    assert error == (f"crawler: error: cannot write the export: {wrote[-1][:-10]}"
                     f"{len(wrote):05d}.warc: file too large for this file system or the "
                     "file size limit (ulimit -f)"), stderr[-3000:]
    assert "Traceback" not in stderr and stdout == ""
    for path in wrote:
        assert f"export: removed {path}: the export did not complete" in stderr
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_export_exits_130_and_leaves_nothing(
    signum: signal.Signals, code: int, tmp_path: Path
) -> None:
    """Ctrl-C, and SIGTERM (systemd, ``timeout``) alike: the export's clean-up runs."""
    data = tmp_path / "big"
    data.mkdir()
    with kvstore.open(data / "main") as db:  # incompressible: gzip takes its time
        for i in range(64):
            url = f"http://a.test/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(
                url, 200, 1.7e9, 0, content_type="text/html",
                body=random.Random(i).randbytes(512 << 10)))
    out = tmp_path / "out"
    out.mkdir()
    proc = start_cli([sys.executable, "-m", "crawler", "export", str(data), "--warc",
                      str(out / "i.warc.gz"), "--max-size", "1M", "--progress-interval", "0"])
    lines = read_lines(proc.stderr)
    wait_for(lambda: any("export: wrote" in ln for ln in lines), proc, "a finished file")
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == code, "".join(lines)[-3000:]
    assert proc.stdout is not None and proc.stdout.read() == b""
    proc.stdout.close()
    text = "".join(lines)
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == (
        "crawler: export interrupted: the files it wrote were removed")
    assert list(out.iterdir()) == []


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
    progress = progress_lines("\n".join(r.getMessage() for r in caplog.records))
    assert progress == [(100, 6, 6, True)]  # the damaged records count as read
    warcio_check(out)
    uris = {r.headers.get("WARC-Target-URI") for r in read_warc(out)[1:]}
    assert uris == set(good)

    strict = tmp_path / "s.warc.gz"
    capsys.readouterr()
    assert main(["export", str(data), "--warc", str(strict), "--strict"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crawler: error: ") and "is damaged" in err
    assert not strict.exists() and not list(tmp_path.glob("s.warc.gz*"))


def test_a_strict_stop_removes_the_split_files_finished_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "late-damage"
    data.mkdir()
    with kvstore.open(data / "main") as db:
        for i in range(20):
            url = f"http://a.test/{i}"
            db[url_key(url)] = encode_page(PageRecord(url, 200, 1.7e9, 0, body=b"<p>x"))
        for j in range(100):  # a bad record that the pass meets after three good ones
            bad = url_key(f"http://a.test/garbage{j}")
            db[bad] = b"not a page record"
            if list(db).index(bad) >= 3:
                break
            del db[bad]
    out = tmp_path / "out"
    out.mkdir()
    caplog.set_level(logging.INFO)
    argv = ["export", str(data), "--warc", str(out / "s.warc.gz"), "--max-size", "1",
            "--jsonl", str(out / "s.jsonl"), "--strict"]
    assert main(argv) == 1
    assert "is damaged" in capsys.readouterr().err
    messages = [r.getMessage() for r in caplog.records]
    finished = [m for m in messages if m.startswith("export: wrote ")]
    assert len(finished) >= 2  # whole files; the next one was being written
    for i in range(len(finished)):
        assert (f"export: removed {out / f's-{i:05d}.warc.gz'}: the export did not complete"
                in messages)
    assert list(out.iterdir()) == []


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


# -- rendered pages: the DOM as a conversion record ---------------------------------------


def _by_type(recs: list[Rec], uri: str) -> dict[str, Rec]:
    got = [r for r in recs if r.headers.get("WARC-Target-URI") == uri]
    by = {r.type: r for r in got}
    assert len(by) == len(got), [r.type for r in got]  # one record of each type a page
    return by


def test_a_rendered_page_gets_a_conversion_record_of_its_dom(tmp_path: Path) -> None:
    data = rendered_crawl(tmp_path / "crawl")
    out = tmp_path / "r.warc.gz"
    assert main(["export", str(data), "--warc", str(out), "--quiet"]) == 0
    warcio_check(out)  # the conversion's digests included
    recs = read_warc(out)
    conversions = [r for r in recs if r.type == "conversion"]
    assert len(conversions) == 1  # not for the cut render, not for the plain page
    conv = conversions[0]
    page = full_records(data)[RENDERED]
    resp = _by_type(recs, RENDERED)["response"]
    assert conv.headers["WARC-Target-URI"] == RENDERED
    assert conv.headers["WARC-Refers-To"] == resp.headers["WARC-Record-ID"]
    assert conv.headers["WARC-Date"] == resp.headers["WARC-Date"] == iso_time(page.fetched_at)
    assert conv.headers["Content-Type"] == "text/html; charset=utf-8"
    assert conv.headers["WARC-Warcinfo-ID"] == recs[0].headers["WARC-Record-ID"]
    assert conv.payload == DOM and resp.payload == page.body != DOM
    assert conv.headers["WARC-Payload-Digest"] == payload_digest(DOM)[1]
    assert conv.headers["WARC-Block-Digest"] == payload_digest(DOM)[1]  # the block is the DOM
    assert recs.index(conv) > recs.index(resp)  # after the page's response
    for url in (CUT, PLAIN):
        assert set(_by_type(recs, url)) == {"request", "response"}
    assert "WARC-Render" not in str([r.headers for r in recs])  # no such standard field


def test_a_rendered_revisit_refers_to_its_own_record_and_splits_keep_it_with_it(
    tmp_path: Path,
) -> None:
    twin = "http://r.test/twin"
    dom2 = DOM.replace(b"only-js", b"twin-js")
    data = rendered_crawl(tmp_path / "crawl",
                          [*pages(), rendered_page(twin, render="ok", dom=dom2)])
    out = tmp_path / "r.warc.gz"
    assert main(["export", str(data), "--warc", str(out), "--max-size", "1", "--quiet"]) == 0
    files = sorted(tmp_path.glob("r-*.warc.gz"))
    assert len(files) == 5  # the first warcinfo alone, then a file a page
    warcio_check(*files)
    recs = [r for f in files for r in read_warc(f)]
    kinds: dict[str, str] = {}
    for url, dom in ((RENDERED, DOM), (twin, dom2)):  # same body: one of them is a revisit
        by = _by_type(recs, url)
        written = by.get("revisit") or by["response"]
        assert by["conversion"].headers["WARC-Refers-To"] == written.headers["WARC-Record-ID"]
        assert by["conversion"].payload == dom
        kinds[url] = written.type
        holding = [f for f in files if any(r.headers.get("WARC-Target-URI") == url
                                           for r in read_warc(f))]
        assert len(holding) == 1  # the conversion is in its page's file
    assert sorted(kinds.values()) == ["response", "revisit"]
