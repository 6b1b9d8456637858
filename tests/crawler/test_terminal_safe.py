"""What a server sends never reaches the operator's terminal raw: control characters,
escape sequences, C1 controls and bidi overrides in the human-readable outputs are
escaped (issue 27, item 3); and the outputs' temporary files never follow a link."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import Answer, LocalServer, run_crawl

from crawler.cli import main
from crawler.config import CrawlerConfig
from crawler.read.listing import CrawlReader
from crawler.run.engine import Engine
from tools.testweb import SiteConfig, TestWeb

# What must never reach a terminal from a server: C0 controls (ESC, BEL, CR...), DEL,
# C1 controls (CSI U+009B, OSC U+009D) and the bidi overrides and isolates.
RAW = ["\x1b", "\x07", "\r", "\x7f", "\x9b", "\x9d", "\u202e", "\u2066", "\u200f"]


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    from crawler.read.display import printable

    assert printable("plain text, ünïcödé, 日本 and \\ stay") == (
        "plain text, ünïcödé, 日本 and \\ stay")
    assert printable("a\x1b[31mred\x07") == "a\\x1b[31mred\\x07"
    assert printable("c1\x9b2J\x85") == "c1\\x9b2J\\x85"
    assert printable("del\x7f nul\0") == "del\\x7f nul\\x00"
    assert printable("rtl\u202eevil\u2066\u200f") == "rtl\\u202eevil\\u2066\\u200f"
    assert printable("line\u2028sep") == "line\\u2028sep"
    assert printable("two\nlines\ttab") == "two\\nlines\\ttab"
    assert printable("two\nlines\ttab\r", keep="\n\t") == "two\nlines\ttab\\r"
    for ch in map(chr, range(0x110000)):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            continue
        out = printable(ch)
        assert not any(c in out for c in RAW), repr(ch)


class Hostile:
    """The answers of a server that puts escape sequences wherever it can; ``base`` is
    its own URL, set once it listens."""

    base = ""

    def __call__(self, path: str, hits: object) -> Answer:
        if path == "/robots.txt":
            text = f"User-agent: *\nAllow: /\nSitemap: {self.base}sm.xml\n"
            return 200, [("Content-Type", "text/plain")], text.encode()
        if path == "/sm.xml":
            xml = (f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url>'
                   f"<loc>{self.base}next</loc><lastmod>2024\u202e-01\u009b31m</lastmod>"
                   "</url></urlset>")
            return 200, [("Content-Type", "application/xml")], xml.encode()
        if path == "/":
            body = ('<html><body><a href="/moved">moved</a> <a href="/next">next</a>'
                    "<p>hello \x1b[2J\x1b]0;owned\x07 world \u202eevil \u009b31m</p>"
                    "</body></html>")
            headers = [("Content-Type", "text/html; charset=utf-8; x=\x1b[31m"),
                       ("Last-Modified", "srv\x1b]0;owned\x07"), ("ETag", '"\x9b2J"')]
            return 200, headers, body.encode()
        if path == "/moved":
            return 301, [("Location", "/next\x1b[1m")], b""
        return 200, [("Content-Type", "text/html\x1b[32m")], b"<p>ok</p>"


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    data = tmp_path_factory.mktemp("hostile") / "crawl"
    hostile = Hostile()
    with LocalServer(hostile) as server:
        hostile.base = server.url("/")
        engine = Engine(CrawlerConfig(data_dir=str(data), threads=4, delay=0.0,
                                      allow_private_ips=True, status_interval=3600.0,
                                      sitemaps="robots", broad=True))
        engine.add_seeds([server.url("/")])
        assert engine.run()
        yield server.url("/"), data


def assert_clean(out: str) -> None:
    for ch in RAW:
        assert ch not in out, (ch, out)


def test_the_records_hold_what_the_server_sent(crawl: tuple[str, Path]) -> None:
    """So that the outputs below have something to escape."""
    seed, data = crawl
    with CrawlReader(data) as reader:
        root = reader.get(seed)
        moved = reader.get(seed + "moved")
    assert root is not None and moved is not None
    assert "\x1b[31m" in root.content_type and "\x1b]0;" in root.headers["last-modified"]
    assert "\x9b" in root.headers["etag"] and "\u202e" in root.body.decode()
    assert "\x1b[1m" in moved.redirect


def test_pages_escapes_content_types(crawl: tuple[str, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pages", str(crawl[1])]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "text/html; charset=utf-8; x=\\x1b[31m" in out
    assert "text/html\\x1b[32m" in out


def test_pages_json_stays_json(crawl: tuple[str, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pages", str(crawl[1]), "--json"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    types = {json.loads(line)["content_type"] for line in out.splitlines()}
    assert "text/html; charset=utf-8; x=\x1b[31m" in types


def test_sitemaps_json_escapes_what_json_leaves_raw(
    crawl: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """JSON escapes C0 controls but leaves DEL, C1 controls and bidi overrides raw:
    those are written as \\u escapes, the same JSON value."""
    assert main(["sitemaps", str(crawl[1]), "--json"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    records = [json.loads(line) for line in out.splitlines()]
    assert [lastmod for rec in records for _, lastmod in rec["urls"]] == [
        "2024\u202e-01\u009b31m"]


def test_export_jsonl_to_stdout_escapes_what_json_leaves_raw(
    crawl: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(crawl[1]), "--jsonl", "-", "--text", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    pages = {p["url"]: p for p in map(json.loads, out.splitlines())}
    assert "\u202e" in pages[crawl[0]]["text"]  # the same value, escaped only on the wire


def test_printable_json_keeps_the_value() -> None:
    from crawler.read.display import printable_json

    value = {"k\u202e": ["\x1b[1m\x7f\x9b\u2066 日本 é \\ \"", 1]}
    text = printable_json(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert_clean(text)
    assert "日本 é" in text


def test_show_escapes_headers_redirects_and_the_body(
    crawl: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    seed, data = crawl
    assert main(["show", str(data), seed]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "last-modified: srv\\x1b]0;owned\\x07" in out
    assert 'etag: "\\x9b2J"' in out
    assert "hello \\x1b[2J\\x1b]0;owned\\x07 world \\u202eevil \\x9b31m" in out
    assert out.count("\n") > 10  # the layout's own line breaks stay
    assert main(["show", str(data), seed + "moved"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "/next\\x1b[1m" in out


def test_show_body_only_writes_the_bytes_as_they_are(
    crawl: tuple[str, Path], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """--body-only is for a pipe or a file: the stored bytes, untouched."""
    seed, data = crawl
    assert main(["show", str(data), seed, "--body-only"]) == 0
    assert b"\x1b[2J" in capsysbinary.readouterr().out


def test_sitemaps_escapes_what_the_sitemap_said(
    crawl: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sitemaps", str(crawl[1]), "--urls"]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "2024\\u202e-01\\x9b31m" in out


def test_links_and_status_print_nothing_raw(
    crawl: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    seed, data = crawl
    assert main(["links", str(data), seed]) == 0
    assert main(["status", str(data)]) == 0
    assert_clean(capsys.readouterr().out)


# -- temporary files: created exclusively, never through a link ---------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with TestWeb(SiteConfig(pages=10, hosts=1, seed=6, crawl_delay=0.0)) as web:
        data = tmp_path_factory.mktemp("part") / "crawl"
        run_crawl(web, data)
        yield data


@pytest.mark.parametrize("kind", ["jsonl", "warc"])
def test_export_does_not_write_through_a_part_symlink(
    kind: str, small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / f"out.{kind}"
    Path(f"{out}.part").symlink_to(victim)
    code = main(["export", str(small), f"--{kind}", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert victim.read_text() == "keep me\n"
    assert os.readlink(f"{out}.part") == str(victim)
    assert code == 1 and not out.exists(), err
    assert err.startswith("crawler: error: ") and err.count("\n") == 1, err
    assert f"{out}.part" in err


def test_export_replaces_a_leftover_part_file_without_writing_into_it(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .part left by a killed export is a plain file: it is replaced, and a hard
    link to it (another name of the same file) keeps its content."""
    out = tmp_path / "out.jsonl"
    other = tmp_path / "other"
    other.write_text("keep me\n")
    os.link(other, f"{out}.part")
    assert main(["export", str(small), "--jsonl", str(out), "--quiet"]) == 0
    assert other.read_text() == "keep me\n"
    assert not Path(f"{out}.part").exists()
    assert len(out.read_text().splitlines()) > 0


def test_report_does_not_write_through_a_part_symlink(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "report.json"
    Path(f"{out}.part").symlink_to(victim)
    code = main(["report", str(small), "--format", "json", "--no-rank", "--quiet",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert victim.read_text() == "keep me\n" and os.readlink(f"{out}.part") == str(victim)
    assert code == 1 and not out.exists(), err
    assert err.startswith("crawler: error: ") and err.count("\n") == 1, err

