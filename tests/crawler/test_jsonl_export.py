"""``python -m crawler export --jsonl``: one object per page matching MainDB, the visible
text option, stdout, and WARC + JSONL in one pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import lxml.html
import pytest
from crawl_helpers import records, run_crawl
from test_page_records import CUT, DOM, PLAIN, RENDERED, rendered_crawl
from test_progress import assert_complete, export_cli, listed_files, progress_lines, wrote_lines
from warcio.archiveiterator import ArchiveIterator

from crawler.cli import main
from crawler.read.listing import CrawlReader, visible_text
from crawler.read.simhash import simhash
from crawler.state.pages import PageRecord
from tools.testweb import SiteConfig, TestWeb, fault

FIELDS = {"url", "final_url", "status", "reason", "content_type", "fetched_at", "ip", "depth",
          "outlinks", "truncated", "noindex", "redirect", "size", "render", "dom_size",
          "revisit"}
GRAPH = {"elapsed", "links", "rank", "rank_scaled"}  # test_linkgraph.py, test_rank.py
TEXT = {"text", "main_text", "title", "description", "canonical", "lang", "opengraph",
        "jsonld", "simhash"}


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    faults = [fault("binary"), fault("meta_robots"), fault("charsets"), fault("nxdomain")]
    with TestWeb(SiteConfig(pages=40, hosts=2, seed=2, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("jsonl") / "crawl"
        run_crawl(web, data)
        yield web, data


def pages_of(data: Path) -> dict[str, PageRecord]:
    with CrawlReader(data) as reader:
        return {p.url: p for p in reader.pages()}


def read_jsonl(text: str) -> dict[str, dict[str, Any]]:
    lines = text.splitlines()
    objs = [json.loads(line) for line in lines]
    by_url = {o["url"]: o for o in objs}
    assert len(by_url) == len(objs)  # one object per page
    return by_url


def test_jsonl_objects_match_the_page_records(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    out = tmp_path / "pages.jsonl"
    assert main(["export", str(crawl[1]), "--jsonl", str(out), "--quiet"]) == 0
    assert not (tmp_path / "pages.jsonl.part").exists()
    got = read_jsonl(out.read_text(encoding="utf-8"))
    pages = pages_of(crawl[1])
    assert set(got) == set(pages)
    kinds = set()
    for url, obj in got.items():
        page = pages[url]
        assert set(obj) == FIELDS | GRAPH
        when = datetime.fromisoformat(obj["fetched_at"].replace("Z", "+00:00"))
        assert obj["fetched_at"].endswith("Z") and when.utcoffset() is not None
        assert abs(when.timestamp() - page.fetched_at) < 1e-5
        assert obj["size"] == len(page.body)
        assert obj["render"] == "" and obj["dom_size"] == 0  # this crawl renders nothing
        for name in FIELDS - {"fetched_at", "size", "dom_size"}:
            assert obj[name] == getattr(page, name), (url, name)
        kinds.add((page.status, page.reason, page.noindex))
    # The crawl has pages, a failure with no answer, non-HTML and noindex pages.
    assert {(200, "", False), (0, "dns_nxdomain", False), (200, "not_html", False),
            (200, "", True)} <= kinds


def test_text_to_stdout_is_the_visible_text(
    crawl: tuple[TestWeb, Path], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    web, data = crawl
    assert main(["export", str(data), "--jsonl", "-", "--text", "--quiet"]) == 0
    got = read_jsonl(capsysbinary.readouterr().out.decode("utf-8"))
    pages = pages_of(data)
    checked = 0
    for url, obj in got.items():
        page = pages[url]
        if page.status != 200 or not page.body:
            assert all(obj[name] is None for name in TEXT), url
            continue
        if "/x/charsets/" in url or "/x/binary/" in url:  # not UTF-8 / not HTML
            continue
        served = lxml.html.fromstring(page.body)
        title = served.findtext(".//title")
        words = "".join(served.text_content().split())
        assert title and " ".join(title.split()) in obj["text"], url
        assert obj["title"] == " ".join(title.split()), url
        assert obj["simhash"] == f"{simhash(obj['text']):016x}", url
        # the main text is the visible text's words, fewer or all (boilerplate dropped)
        assert obj["main_text"] and set(obj["main_text"].split()) <= set(obj["text"].split())
        assert "<" not in obj["text"] or "<" in words, url
        # Same characters in the same order; only the spacing at block boundaries differs.
        assert obj["text"].replace(" ", "") == words, url
        checked += 1
    assert checked >= 30
    latin = got[web.url("h0.test", "/x/charsets/header")]["text"]
    assert "café" in latin  # decoded by the header's charset, written as UTF-8
    assert "日本" in got[web.url("h0.test", "/x/charsets/sjis")]["text"]
    assert "привет" in got[web.url("h0.test", "/x/charsets/meta")]["text"]


def test_text_is_bounded(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["export", str(crawl[1]), "--jsonl", str(out), "--text", "--text-limit", "40",
                 "--quiet"]) == 0
    texts = [o["text"] for o in read_jsonl(out.read_text(encoding="utf-8")).values()]
    assert max(len(t) for t in texts if t is not None) == 40


def test_warc_and_jsonl_in_one_pass(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    warc, jsonl = tmp_path / "c.warc.gz", tmp_path / "c.jsonl"
    assert main(["export", str(crawl[1]), "--warc", str(warc), "--jsonl", str(jsonl),
                 "--quiet"]) == 0
    objs = read_jsonl(jsonl.read_text(encoding="utf-8"))
    seen: dict[str, str] = {}
    with open(warc, "rb") as f:
        for r in ArchiveIterator(f):
            if r.rec_type in ("response", "revisit", "metadata"):
                seen[r.rec_headers.get_header("WARC-Target-URI")] = r.rec_type
    assert set(seen) == set(objs)
    for url, kind in seen.items():
        assert (kind == "metadata") == (objs[url]["status"] == 0)


def test_the_jsonl_file_is_named_with_its_lines_and_bytes(
    crawl: tuple[TestWeb, Path], tmp_path: Path
) -> None:
    warc, jsonl = tmp_path / "c.warc.gz", tmp_path / "c.jsonl"
    done = export_cli(str(crawl[1]), "--warc", str(warc), "--jsonl", str(jsonl),
                      "--progress-interval", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert listed_files(done.stdout) == [str(warc), str(jsonl)]
    n = len(records(crawl[1]))
    lines = jsonl.read_text(encoding="utf-8").splitlines()
    assert len(lines) == n
    assert wrote_lines(done.stderr)[-1] == (str(jsonl), n, jsonl.stat().st_size)
    assert_complete(progress_lines(done.stderr), n)


def test_jsonl_on_stdout_keeps_stdout_pure(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    """With --jsonl -, stdout carries only the JSON lines: the list of files written
    goes to stderr with the log."""
    warc = tmp_path / "s.warc.gz"
    done = export_cli(str(crawl[1]), "--jsonl", "-", "--warc", str(warc))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(read_jsonl(done.stdout)) == len(records(crawl[1]))  # every line is JSON
    assert done.stderr.strip().splitlines()[-1].endswith(f" wrote {warc}")
    assert "JSON lines" in done.stderr and "to the output stream" in done.stderr


def test_a_jsonl_that_cannot_be_written_leaves_no_warc_either(
    crawl: tuple[TestWeb, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "missing" / "c.jsonl"
    done = export_cli(str(crawl[1]), "--warc", str(tmp_path / "c.warc.gz"), "--jsonl",
                      str(missing))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"crawler: error: cannot write the export: {missing}: the directory "
                           f"{missing.parent} does not exist: create it first\n")
    assert list(tmp_path.iterdir()) == []


def test_the_same_file_for_both_outputs_is_a_usage_error(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "both")
    assert main(["export", str(crawl[1]), "--warc", out, "--jsonl", out]) == 2
    assert "--warc and --jsonl name the same file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_render_status_and_dom_size_of_rendered_pages(tmp_path: Path) -> None:
    data = rendered_crawl(tmp_path / "crawl")
    out = tmp_path / "r.jsonl"
    assert main(["export", str(data), "--jsonl", str(out), "--text", "--quiet"]) == 0
    got = read_jsonl(out.read_text(encoding="utf-8"))
    assert {u: (o["render"], o["dom_size"]) for u, o in got.items()} == {
        RENDERED: ("ok", len(DOM)), CUT: ("render_timeout", 0), PLAIN: ("", 0)}
    assert all(set(o) == FIELDS | GRAPH | TEXT for o in got.values())
    assert got[RENDERED]["text"] == "b"  # --text stays the server body's text
    assert got[RENDERED]["size"] == len(pages_of(data)[RENDERED].body) != len(DOM)


def _page(body: bytes, content_type: str = "text/html") -> PageRecord:
    return PageRecord("http://a.test/", 200, 1.7e9, 0, content_type=content_type, body=body)


class TestVisibleText:
    def test_scripts_styles_and_markup_are_removed(self) -> None:
        html = (b"<html><head><title>T</title><style>p{color:red}</style>"
                b"<script>var x = '<p>no</p>';</script></head><body><h1>Head</h1>"
                b"<p>one&amp;two <b>bold</b>word</p><noscript>enable js</noscript>"
                b"<template><p>later</p></template><ul><li>a</li><li>b</li></ul>"
                b"<!-- a comment --></body></html>")
        assert visible_text(_page(html)) == "T Head one&two boldword a b"

    def test_charset_plain_text_binary_and_empty(self) -> None:
        latin = _page("<p>café</p>".encode("latin-1"), "text/html; charset=iso-8859-1")
        assert visible_text(latin) == "café"
        assert visible_text(_page(b"a  b\n\nc", "text/plain")) == "a b c"
        assert visible_text(_page(b"\x89PNG\r\n\x1a\n\0\0", "image/png")) is None
        assert visible_text(_page(b"")) is None

    def test_deep_nesting_and_limit(self) -> None:
        deep = b"<div>" * 100_000 + b"deep text" + b"</div>" * 100_000
        assert visible_text(_page(deep)) == "deep text"
        long = b"<p>" + b"word " * 100_000 + b"</p>"
        text = visible_text(_page(long), limit=1000)
        assert text is not None and len(text) == 1000 and text.startswith("word word")
