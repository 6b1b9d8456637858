"""Reading a page record's header without its body (issue 31): decode_page_head and
read_page_head (crawler.state.pages), CrawlReader.load(with_body=False), and the
selection of retry and recrawl, whose --dry-run reads no body."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
from crawler.cli import main
from crawler.exceptions import CrawlerError
from crawler.read.listing import CrawlReader
from crawler.state.pages import (
    PageRecord,
    decode_page,
    decode_page_head,
    encode_page,
    pack_links,
    read_page_head,
)
from crawler.state.recrawl import RecrawlSelection, recrawl
from crawler.web.urls import url_key

TAIL = 1 << 20  # kvstore's default tail_check_bytes: damage must lie before the last MiB


def record(i: int, *, links: int = 3, body: bytes = b"", dom: bytes = b"",
           status: int = 200, reason: str = "") -> PageRecord:
    url = f"http://a.test/{i}"
    return PageRecord(url, status, 1.7e9 + i, 1, reason=reason, headers={"etag": f'"{i}"'},
                      links=pack_links([f"http://a.test/{i}/{j}" for j in range(links)]),
                      render="ok" if dom else "", dom=dom, body=body)


@settings(max_examples=80, deadline=None)
@given(links=st.integers(0, 400), body=st.binary(max_size=3000), dom=st.binary(max_size=200),
       cut=st.integers(0, 20_000))
def test_the_head_of_any_prefix_is_the_record_without_its_body(
    links: int, body: bytes, dom: bytes, cut: int
) -> None:
    data = encode_page(record(1, links=links, body=body, dom=dom))
    whole = decode_page(data, with_body=False)
    for with_links in (True, False):
        want = whole if with_links else PageRecord(**{**whole.header_dict(), "links": b""})
        got = decode_page_head(data[:cut], with_links=with_links)
        steps = 0
        while isinstance(got, int):  # too short: it says how much it needs, never more
            assert cut < got <= len(data) and steps < 3  # the fixed head, header, links
            cut, steps = got, steps + 1
            got = decode_page_head(data[:cut], with_links=with_links)
        assert got == want


def test_read_page_head_reads_once_and_twice_only_when_the_head_is_longer() -> None:
    data = encode_page(record(1, links=1000, body=random.Random(1).randbytes(50_000)))
    asked: list[int] = []

    def read(n: int) -> bytes:
        asked.append(n)
        return data[:n]

    assert read_page_head(read).url == "http://a.test/1" and asked == [2048]
    asked.clear()
    page = read_page_head(read, with_links=True)  # 17 KB of links: a second read
    assert page.link_count() == 1000 and len(asked) == 2 and asked[1] < 20_000
    for n in (3, 40, 5000):  # a record shorter than its own head says
        with pytest.raises(CrawlerError, match="cut in its header or links"):
            read_page_head(lambda want, n=n: data[: min(want, n)], with_links=True)


def damaged_body_crawl(data: Path) -> tuple[bytes, bytes]:
    """A crawl whose page 0 has a damaged body (one flipped bit, a MiB before the end of
    VAL) and whose page 1 is sound; (key of page 0, key of page 1)."""
    rng = random.Random(2)
    main_dir = data / "main"
    with kvstore.open(main_dir) as db:
        db[url_key("http://a.test/0")] = encode_page(record(0, body=rng.randbytes(20_000)))
        db.flush()
        (val,) = main_dir.glob("data-*.val")
        damage_at = val.stat().st_size - 100  # inside page 0's compressed body
        db[url_key("http://a.test/1")] = encode_page(record(1, body=rng.randbytes(20_000)))
        for i in range(2, 2 + TAIL // 8000):  # failures, no body: what retry takes
            db[url_key(f"http://a.test/{i}")] = encode_page(
                record(i, status=0, reason="connect_refused", body=rng.randbytes(8000)))
    raw = bytearray(val.read_bytes())
    raw[damage_at] ^= 0x10
    val.write_bytes(bytes(raw))
    return url_key("http://a.test/0"), url_key("http://a.test/1")


def test_a_reader_without_bodies_does_not_see_a_damaged_body(tmp_path: Path) -> None:
    bad, good = damaged_body_crawl(tmp_path)
    with CrawlReader(tmp_path) as reader:
        head = reader.load(0, bad, with_body=False)  # the CRC covers the body: not checked
        assert head is not None and head.url == "http://a.test/0" and head.link_count() == 3
        assert head.body == b"" and reader.skipped == 0
        assert reader.load(0, bad) is None and reader.skipped == 1  # a full read sees it
        sound = reader.load(0, good)
        assert sound is not None and reader.load(0, good, with_body=False) == decode_page(
            encode_page(sound), with_body=False)


def test_recrawl_dry_run_reads_no_body_and_the_real_run_leaves_damage_alone(
    tmp_path: Path
) -> None:
    bad, good = damaged_body_crawl(tmp_path)
    pages = RecrawlSelection(0, statuses=("200",))
    dry = recrawl(str(tmp_path), pages, dry_run=True)
    assert (dry.requeued, dry.damaged) == (2, 0)  # the damaged body is not read
    done = recrawl(str(tmp_path), pages)
    assert (done.requeued, done.damaged) == (1, 1)  # read whole before it is moved
    with kvstore.open(tmp_path / "main", readonly=True) as db:
        assert bad in db and good not in db
    with kvstore.open(tmp_path / "prior", readonly=True) as prior:
        assert list(prior) == [good]


def test_retry_dry_run_never_reads_a_whole_page_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged_body_crawl(tmp_path)
    real_get, real_item = kvstore.Store.get, kvstore.Store.__getitem__

    def guard(store: kvstore.Store) -> None:
        assert not store.path.endswith("main"), "a dry run read a whole page record"

    def get(self: kvstore.Store, key: bytes, default: object = None) -> object:
        guard(self)
        return real_get(self, key, default)

    def item(self: kvstore.Store, key: bytes) -> bytes:
        guard(self)
        return real_item(self, key)

    monkeypatch.setattr(kvstore.Store, "get", get)
    monkeypatch.setattr(kvstore.Store, "__getitem__", item)
    assert main(["retry", str(tmp_path), "--dry-run"]) == 0
    failures = 1 + TAIL // 8000 - 1
    assert f"would re-queue {failures} failures" in capsys.readouterr().out
    assert main(["recrawl", str(tmp_path), "--older-than", "0", "--dry-run"]) == 0
    assert "would re-queue 2 pages" in capsys.readouterr().out
