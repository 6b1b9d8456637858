"""Real pywb over an exported crawl: every page replays with the status and the bytes
``show --body-only`` gives, after a recrawl too (a 304 must not replay as an empty 304).

The crawl has redirects (the test web's and a chain), a 404, pages whose payload
repeats another's (``?v=1`` variants, and two pages of a local server), a body cut
at the size limit, and a recrawl 1 s later (pywb's timestamps are seconds) that
the unchanged pages answer with 304, an image whose body the crawler does not keep
among them. pywb indexes the WARC itself (``wb-manager add``); the WACZ is loaded
with ``wb-manager add --unpack-wacz``, which takes the WACZ's own CDXJ index.
pywb runs as a subprocess on 127.0.0.1."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from crawl_helpers import META_PATHS, Answer, Hit, LocalServer, html_links, run_cli, run_crawl
from test_warc_export import Rec, read_warc, warcio_check

from crawler.cli import main
from crawler.read.listing import CrawlReader, iso_time
from crawler.state.pages import PageRecord
from tools.testweb import SiteConfig, TestWeb, fault

NOT_MODIFIED_PROFILE = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
BIN = Path(sys.executable).parent  # pywb's and wacz's commands, installed beside python
_SAME = b"<html><body><p>the same payload on two pages</p></body></html>"


def _local(path: str, hits: list[Hit]) -> Answer:
    """A page linking an image and two pages of one payload; a path asked before is
    answered 304 (the recrawl's conditional GET: the test asserts it was one)."""
    if path in META_PATHS:
        return 404, [], b""
    validators = [("ETag", f'"{path}"'), ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")]
    if any(h.path == path for h in hits):
        return 304, validators, b""
    if path == "/img.png":
        return 200, [("Content-Type", "image/png"), *validators], b"\x89PNG\r\n\x1a\n" * 64
    if path in ("/same-a.html", "/same-b.html"):
        return 200, [("Content-Type", "text/html"), *validators], _SAME
    status, headers, body = html_links(["/img.png", "/same-a.html", "/same-b.html"])
    return status, [*headers, *validators], body


@dataclass
class Recrawled:
    data: Path
    warc: Path
    wacz: Path
    pages: dict[str, PageRecord]  # with bodies
    conditional: list[Hit]  # the local server's second requests


def recrawled(tmp: Path) -> Recrawled:
    """A crawl, a recrawl of every page 1 s later, and its WARC and WACZ exports."""
    faults = [fault("redirects"), fault("huge_body", size=3 << 20), fault("binary")]
    data = tmp / "crawl"
    with TestWeb(SiteConfig(pages=40, hosts=3, seed=0, crawl_delay=0.0),
                 faults=faults) as web, LocalServer(_local) as local:
        seeds = [web.seed_url, local.url("/")]
        assert run_crawl(web, data, seeds=seeds, max_body_bytes=1 << 20).complete
        time.sleep(1.1)
        done = run_cli([sys.executable, "-m", "crawler", "recrawl", str(data),
                        "--older-than", "0s"])
        assert done.returncode == 0, done.stderr
        asked = len(local.hits)
        assert run_crawl(web, data, seeds=seeds, max_body_bytes=1 << 20).complete
        conditional = [h for h in local.hits[asked:] if h.path not in META_PATHS]
    warc, wacz = tmp / "crawl.warc.gz", tmp / "crawl.wacz"
    assert main(["export", str(data), "--warc", str(warc), "--wacz", str(wacz),
                 "--quiet"]) == 0
    with CrawlReader(data) as reader:
        pages = {p.url: p for p in reader.pages()}
    return Recrawled(data, warc, wacz, pages, conditional)


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Recrawled:
    return recrawled(tmp_path_factory.mktemp("recrawled"))


def test_the_crawl_has_what_replay_must_survive(crawl: Recrawled) -> None:
    pages = crawl.pages.values()
    kinds = {
        "redirects": [p for p in pages if 300 <= p.status < 400],
        "404s": [p for p in pages if p.status == 404],
        "304s": [p for p in pages if p.revisit == "not_modified"],
        "304s without a body": [p for p in pages if p.revisit == "not_modified" and not p.body],
        "cut bodies": [p for p in pages if p.truncated and p.body],
    }
    assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}
    bodies = [p.body for p in pages if p.revisit == "not_modified" and p.body]
    assert len(bodies) > len(set(bodies)), "304'd pages whose payload repeats another's"
    assert crawl.conditional and all("if-none-match" in h.headers and h.status == 304
                                     for h in crawl.conditional)


def _by_id(recs: list[Rec]) -> dict[str, Rec]:
    return {r.headers["WARC-Record-ID"]: r for r in recs}


def test_every_revisit_refers_to_a_response_and_carries_the_payload_digest(
    crawl: Recrawled,
) -> None:
    warcio_check(crawl.warc)
    recs = read_warc(crawl.warc)
    ids = _by_id(recs)
    revisits = [r for r in recs if r.type == "revisit"]
    not_modified = [r for r in revisits if r.headers["WARC-Profile"] == NOT_MODIFIED_PROFILE]
    assert len(not_modified) == sum(p.revisit == "not_modified" for p in crawl.pages.values())
    for rev in revisits:
        original = ids[rev.headers["WARC-Refers-To"]]
        assert original.type == "response", rev.headers
        assert rev.headers["WARC-Refers-To-Target-URI"] == original.headers["WARC-Target-URI"]
        assert rev.headers["WARC-Refers-To-Date"] == original.headers["WARC-Date"]
        assert rev.headers["WARC-Payload-Digest"] == original.headers["WARC-Payload-Digest"]


def test_a_304_is_a_server_not_modified_revisit_that_says_what_was_answered(
    crawl: Recrawled,
) -> None:
    recs = read_warc(crawl.warc)
    ids = _by_id(recs)
    for url, page in crawl.pages.items():
        if page.revisit != "not_modified":
            continue
        mine = [r for r in recs if r.headers.get("WARC-Target-URI") == url]
        rev = next(r for r in mine if r.headers.get("WARC-Profile") == NOT_MODIFIED_PROFILE)
        req = next(r for r in mine if r.type == "request"
                   and r.headers.get("WARC-Concurrent-To") == rev.headers["WARC-Record-ID"])
        earlier = [r for r in mine if r is not rev and r.type in ("response", "revisit")]
        assert len(earlier) == 1, [r.type for r in mine]
        assert rev.headers["WARC-Date"] == req.headers["WARC-Date"] == iso_time(page.fetched_at)
        # The record keeps the earlier fetch's address: the 304's is not known.
        assert "WARC-IP-Address" not in rev.headers and "WARC-IP-Address" not in req.headers
        assert earlier[0].headers["WARC-IP-Address"] == page.ip
        assert earlier[0].headers["WARC-Date"] == iso_time(page.revisit_of)
        # The block: the stored response as the 304 freshened it, and what was answered.
        assert rev.status == 200 and rev.http["x-crawler-original-status"] == "304"
        assert rev.http["etag"] == page.headers["etag"]
        assert rev.http["content-length"] == str(len(page.body)) and rev.payload == b""
        assert "date" not in earlier[0].http  # the record's Date is the 304's
        assert req.http["if-none-match"] == page.headers["etag"]
        assert ids[rev.headers["WARC-Refers-To"]].type == "response"


# -- pywb ---------------------------------------------------------------------------------------


class Pywb:
    """A pywb collection in ``root`` holding ``archive``, served on 127.0.0.1."""

    def __init__(self, root: Path, archive: Path) -> None:
        self.root, self.port = root, 0
        root.mkdir()
        self._run("wb-manager", "init", "coll")
        unpack = ["--unpack-wacz"] if archive.suffix == ".wacz" else []
        self._run("wb-manager", "add", *unpack, "coll", str(archive))
        self.index = (root / "collections/coll/indexes/index.cdxj").read_text()
        self._proc: subprocess.Popen[bytes] | None = None

    def _run(self, *args: str) -> None:
        done = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=self.root,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]

    def __enter__(self) -> Pywb:
        for _ in range(5):  # a port taken between the probe and pywb's bind: another
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            log = open(self.root / "pywb.log", "wb")  # noqa: SIM115 - the process owns it
            self._proc = subprocess.Popen(
                [str(BIN / "pywb"), "--bind", "127.0.0.1", "--port", str(self.port)],
                cwd=self.root, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            deadline = time.monotonic() + 60
            while self._proc.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    time.sleep(0.1)
            self.__exit__()
        raise AssertionError((self.root / "pywb.log").read_text()[-3000:])

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=30)
            self._proc = None

    def replay(self, url: str, when: float) -> tuple[int, bytes]:
        """pywb's answer for ``url`` at ``when``: the status and the raw bytes (``id_``:
        the archived body as it is, no rewriting); redirects are not followed."""
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(when))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", f"/coll/{stamp}id_/{url}")
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()


@pytest.fixture
def shown(crawl: Recrawled, capsysbinary: pytest.CaptureFixture[bytes]) -> Iterator[
        dict[str, bytes]]:
    """``show DIR URL --body-only`` of every page with an HTTP answer."""
    out = {}
    for url, page in crawl.pages.items():
        if page.status > 0:
            assert main(["show", str(crawl.data), url, "--body-only"]) == 0
            out[url] = capsysbinary.readouterr().out
    yield out


def _replays(pywb: Pywb, crawl: Recrawled, shown: dict[str, bytes]) -> list[str]:
    """What differs between pywb's replay and the crawl, page by page: each capture of
    a 304'd page (the 304 and the fetch whose body it kept) replays the body."""
    wrong = []
    for url, body in shown.items():
        page = crawl.pages[url]
        times = [page.fetched_at] + ([page.revisit_of] if page.revisit_of else [])
        for when in times:
            status, got = pywb.replay(url, when)
            if (status, got) != (page.status, body):
                wrong.append(f"{url} at {iso_time(when)} ({page.revisit or 'fetched'}): "
                             f"{status}, {len(got)} bytes; expected {page.status}, "
                             f"{len(body)} bytes")
    return wrong


def test_every_page_of_the_warc_replays_in_pywb_as_show_prints_it(
    crawl: Recrawled, shown: dict[str, bytes], tmp_path: Path
) -> None:
    assert len(shown) > 50
    with Pywb(tmp_path / "pywb", crawl.warc) as pywb:
        wrong = _replays(pywb, crawl, shown)
    assert not wrong, "\n".join(wrong)


def test_the_wacz_loads_in_pywb_by_its_own_index_and_every_page_replays(
    crawl: Recrawled, shown: dict[str, bytes], tmp_path: Path
) -> None:
    with Pywb(tmp_path / "pywb", crawl.wacz) as pywb:
        # wb-manager took the WACZ's index (it indexes nothing itself for a WACZ)
        assert pywb.index.count("\n") == sum(
            r.type in ("response", "revisit") for r in read_warc(crawl.warc))
        wrong = _replays(pywb, crawl, shown)
    assert not wrong, "\n".join(wrong)
