"""``python -m crawler pages`` and ``show``, and the CLI contract of ``export``: help,
usage errors (exit 2), data errors (exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import REPO, run_crawl
from test_page_records import CUT, DOM, HTML, PLAIN, RENDERED, rendered_crawl

import kvstore
from crawler.cli import main
from crawler.read.listing import CrawlReader
from crawler.state.pages import PageRecord, encode_page
from crawler.web.urls import url_key
from tools.testweb import SiteConfig, TestWeb, fault

PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256))


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    faults = [fault("binary"), fault("nxdomain")]
    with TestWeb(SiteConfig(pages=40, hosts=3, seed=4, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("pages") / "crawl"
        run_crawl(web, data)
        yield web, data


def pages_of(data: Path) -> dict[str, PageRecord]:
    with CrawlReader(data) as reader:
        return {p.url: p for p in reader.pages()}


def lines(out: str) -> list[list[str]]:
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.parametrize("command", ["export", "pages", "show"])
def test_each_command_has_help_with_an_example_and_is_documented(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    assert "example: python -m crawler " + command in capsys.readouterr().out
    assert f"python -m crawler {command} DIR" in (REPO / "docs" / "EXPORT.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "d"],  # no output
        ["export", "d", "--max-size", "1M", "--jsonl", "x.jsonl"],  # split without --warc
        ["export", "d", "--jsonl", "x.jsonl", "--text-limit", "0"],
        ["export", "d", "--warc", "x.warc.gz", "--text"],  # text without --jsonl
        ["export", "d", "--warc", "-"],
        ["export", "d", "--warc", "x.warc.gz", "--max-size", "0"],
        ["export", "d", "--warc", "x.warc.gz", "--max-size", "lots"],
        ["pages", "d", "--limit", "-1"],
        ["pages", "d", "--status", "ok"],
        ["show", "d"],  # no URL
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_data_errors_exit_1_with_a_clear_message(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    cases = [
        (["pages", str(tmp_path / "none")], "no such crawl directory"),
        (["pages", str(tmp_path)], "not a crawl directory"),
        (["export", str(tmp_path / "none"), "--jsonl", "-"], "no such crawl directory"),
        (["export", str(data), "--warc", str(tmp_path / "no" / "dir.warc.gz")],
         "cannot write the export"),
        (["show", str(data), web.url("h0.test", "/not-crawled.html")], "not in the crawl"),
        (["show", str(data), "ftp://h0.test/"], "bad URL"),
        (["pages", str(data), "--host", "a b"], "bad --host"),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("crawler: error: ") and message in err, (argv, err)
    assert not list(tmp_path.glob("**/*.part"))


def test_pages_lists_every_record(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pages = pages_of(crawl[1])
    assert main(["pages", str(crawl[1])]) == 0
    got = lines(capsys.readouterr().out)
    assert sorted(row[3] for row in got) == sorted(pages)
    for status, kind, size, url in got:
        page = pages[url]
        assert int(status) == page.status and int(size) == len(page.body)
        if page.reason:
            assert kind.endswith(f"[{page.reason}]")
        else:
            assert kind == page.content_type


def test_pages_filters_and_limit(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    pages = pages_of(data)
    for code in (200, 404, 0):
        assert main(["pages", str(data), "--status", str(code)]) == 0
        got = lines(capsys.readouterr().out)
        assert {row[3] for row in got} == {u for u, p in pages.items() if p.status == code}
        assert got  # the crawl has each kind
    assert main(["pages", str(data), "--status", "0"]) == 0
    assert "[dns_nxdomain]" in capsys.readouterr().out
    h1 = {u for u in pages if u.startswith(web.url("h1.test", "/"))}
    for host in ("h1.test", "H1.TEST", f"h1.test:{web.http_port}"):
        assert main(["pages", str(data), "--host", host]) == 0
        assert {row[3] for row in lines(capsys.readouterr().out)} == h1, host
    assert main(["pages", str(data), "--host", "h1.test:1"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["pages", str(data), "--status", "200", "--limit", "3"]) == 0
    got = lines(capsys.readouterr().out)
    assert len(got) == 3 and all(row[0] == "200" for row in got)


def test_show_normalizes_the_url_and_prints_fields_headers_and_body(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    page = pages_of(data)[web.seed_url]
    spelled = web.seed_url.replace("http://h0.test", "HTTP://H0.Test") + "x/../#top"
    assert main(["show", str(data), spelled]) == 0
    out = capsys.readouterr().out
    head, _, body = out.partition("\n\n")
    assert f"url:          {web.seed_url}" in head.splitlines()
    assert "status:       200" in head.splitlines()
    assert f"ip:           {page.ip}" in head.splitlines()
    assert f"body_bytes:   {len(page.body)}" in head.splitlines()
    assert f"  content-type: {page.headers['content-type']}" in head.splitlines()
    assert body == page.body.decode("utf-8") + "\n"


def test_show_body_only_writes_the_stored_bytes(
    crawl: tuple[TestWeb, Path], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    web, data = crawl
    url = web.url("h0.test", "/x/binary/png-as-html")  # PNG bytes served as text/html
    assert main(["show", str(data), url, "--body-only"]) == 0
    body = capsysbinary.readouterr().out
    assert body.startswith(b"\x89PNG") and body == pages_of(data)[url].body


def test_show_of_a_page_without_body_and_a_binary_body(
    crawl: tuple[TestWeb, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    missing = next(u for u, p in pages_of(data).items() if p.status == 404)
    assert main(["show", str(data), missing]) == 0
    out = capsys.readouterr().out
    assert "status:       404" in out and out.endswith("[no body stored]\n")

    own = tmp_path / "own"
    own.mkdir()
    with kvstore.open(own / "main") as db:
        db[url_key("http://a.test/i.png")] = encode_page(
            PageRecord("http://a.test/i.png", 200, 1.7e9, 0, content_type="image/png", body=PNG))
    assert main(["show", str(own), "http://a.test/i.png"]) == 0
    out = capsys.readouterr().out
    assert f"[binary body: {len(PNG)} bytes; first 64 in hex: {PNG[:64].hex()};" in out


def test_damaged_record_pages_warns_and_show_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "c"
    data.mkdir()
    with kvstore.open(data / "main") as db:
        db[url_key("http://a.test/")] = encode_page(PageRecord("http://a.test/", 200, 1.7e9, 0))
        db[url_key("http://a.test/bad")] = b"KVCP\x01\x05\x00\x00\x00{not json"
    assert main(["pages", str(data)]) == 0
    assert capsys.readouterr().out == "200\t-\t0\thttp://a.test/\n"
    done = subprocess.run([sys.executable, "-m", "crawler", "pages", str(data)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "200\t-\t0\thttp://a.test/\n"
    assert "WARNING" in done.stderr and "is damaged" in done.stderr  # the operator sees it
    assert url_key("http://a.test/bad").hex() in done.stderr
    assert main(["show", str(data), "http://a.test/bad"]) == 1
    assert "is damaged" in capsys.readouterr().err


def test_pages_into_a_closed_pipe_is_not_an_error(tmp_path: Path) -> None:
    data = tmp_path / "big"
    data.mkdir()
    with kvstore.open(data / "main") as db:
        for i in range(3000):  # ~100 KB of lines: more than a pipe holds
            url = f"http://a.test/page/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(url, 200, 1.7e9, 0, content_type="text/html"))
    cmd = f"{sys.executable} -m crawler pages {data} | head -n 1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 and done.stderr == ""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rendered_crawl(tmp_path_factory.mktemp("rendered") / "crawl")


def test_show_prints_the_render_status_of_a_rendered_or_cut_page(
    rendered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for url, status, size in ((RENDERED, "ok", len(DOM)), (CUT, "render_timeout", 0)):
        assert main(["show", str(rendered), url]) == 0
        head, _, body = capsys.readouterr().out.partition("\n\n")
        assert f"render:       {status}" in head.splitlines()
        assert f"dom_bytes:    {size}" in head.splitlines()
        assert head.index("render:") < head.index("headers:")  # with the fields
        assert body.encode() == (HTML if url == RENDERED else HTML.replace(b"app", b"cut")) + b"\n"
    assert main(["show", str(rendered), PLAIN]) == 0
    out = capsys.readouterr().out
    assert "render:" not in out and "dom_bytes:" not in out  # not rendered: as before


def test_show_dom_prints_the_rendered_dom_instead_of_the_body(
    rendered: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["show", str(rendered), RENDERED, "--dom"]) == 0
    head, _, body = capsysbinary.readouterr().out.decode("utf-8").partition("\n\n")
    assert "render:       ok" in head.splitlines()
    assert "  content-type: text/html; charset=utf-8" in head.splitlines()  # headers kept
    assert body == DOM.decode("utf-8") + "\n"
    assert main(["show", str(rendered), RENDERED, "--dom", "--body-only"]) == 0
    assert capsysbinary.readouterr().out == DOM


@pytest.mark.parametrize(("url", "why"), [(CUT, "render: render_timeout"),
                                          (PLAIN, "render: not rendered")])
def test_show_dom_of_a_page_without_one_is_one_line_and_exit_1(
    rendered: Path, url: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ([], ["--body-only"]):
        assert main(["show", str(rendered), url, "--dom", *extra]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err == f"crawler: error: {url}: no rendered DOM in the record ({why})\n"
    done = subprocess.run([sys.executable, "-m", "crawler", "show", str(rendered), url, "--dom"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_pages_json_has_the_render_fields(
    rendered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pages", str(rendered), "--json"]) == 0
    got = {o["url"]: o for o in map(json.loads, capsys.readouterr().out.splitlines())}
    assert {u: (o["render"], o["dom_size"]) for u, o in got.items()} == {
        RENDERED: ("ok", len(DOM)), CUT: ("render_timeout", 0), PLAIN: ("", 0)}
