"""Page records (crawler.state.pages): the byte layout of versions 2 and 3 (the rendered
DOM), and :func:`rendered_crawl`, a crawl directory written through the Frontier with a
rendered page, a cut render and a plain page, for the export and ``show`` tests."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvstore
from crawler.exceptions import CrawlerError
from crawler.state.frontier import Frontier, Outcome
from crawler.state.pages import (
    PageRecord,
    Pending,
    bulk_counter,
    bulk_depths,
    bulk_key,
    bulk_keys,
    decode_bulk,
    decode_page,
    encode_bulk,
    encode_page,
    pack_links,
    put_bulks,
)
from crawler.web.urls import url_key

HEAD = struct.Struct("<4sBI")  # magic, version, header length (docs: crawler/state/pages.py)
HTML = b"<html><body><a href='/b'>b</a><div id='app'></div></body></html>"
DOM = ("<html><head></head><body><a href=\"/b\">b</a><div id=\"app\">"
       "<a href=\"/only-js\">d\u00e9j\u00e0 vu</a></div></body></html>").encode()

RENDERED = "http://r.test/rendered"
CUT = "http://r.test/cut"
PLAIN = "http://r.test/plain"


def page(url: str = RENDERED, **kw: object) -> PageRecord:
    fields: dict[str, object] = {
        "final_url": url, "ip": "127.0.0.1", "content_type": "text/html; charset=utf-8",
        "headers": {"content-type": "text/html; charset=utf-8"}, "outlinks": 1,
        "links": pack_links(["http://r.test/b"]), "elapsed": 0.25, "body": HTML, **kw,
    }
    return PageRecord(url, 200, 1.7e9 + 0.5, 0, **fields)  # type: ignore[arg-type]


def pages() -> list[PageRecord]:
    """The three kinds of page record rendering leaves (bodies differ: no revisits)."""
    return [page(RENDERED, render="ok", dom=DOM),
            page(CUT, render="render_timeout", body=HTML.replace(b"app", b"cut")),
            page(PLAIN, body=HTML.replace(b"app", b"plain"))]


def rendered_crawl(data: Path, records: list[PageRecord] | None = None) -> Path:
    """A crawl directory holding ``records`` (default :func:`pages`), written as a crawl
    writes them: seeds admitted, claimed, outcomes submitted and committed."""
    records = pages() if records is None else records
    by_url = {r.url: r for r in records}
    frontier = Frontier(str(data))
    try:
        frontier.add_seeds([Pending(url) for url in by_url])
        frontier.commit()
        done = 0
        while (claimed := frontier.claim()) is not None:
            for c in claimed:
                frontier.submit(Outcome(c, encode_page(by_url[c.entry.url])))
                done += 1
            frontier.commit()
        assert done == len(by_url)
    finally:
        frontier.close()
    return data


def split(data: bytes) -> tuple[int, dict[str, object], bytes]:
    """(version, JSON header, the bytes after it) of an encoded record."""
    magic, version, hlen = HEAD.unpack_from(data)
    assert magic == b"KVCP"
    return version, json.loads(data[HEAD.size : HEAD.size + hlen]), data[HEAD.size + hlen :]


def dom_at(data: bytes) -> int:
    """The offset of a version 3 record's DOM length field (right after the links)."""
    _, _, rest = split(data)
    n: int = struct.unpack_from("<I", rest)[0]
    return len(data) - len(rest) + 4 + 17 * n


class TestVersion2:
    def test_a_plain_page_is_version_2_without_render_and_round_trips(self) -> None:
        rec = page(PLAIN)
        data = encode_page(rec)
        version, header, rest = split(data)
        assert version == 2
        assert "render" not in header and "dom" not in header and "body" not in header
        n = len(rec.links) // 17
        assert rest[:4] == struct.pack("<I", n)
        assert zlib.decompress(rest[4 + 17 * n :]) == HTML  # the body right after the links
        assert decode_page(data) == rec

    def test_a_cut_render_is_version_3_with_its_reason_and_no_dom(self) -> None:
        # Version 3, not 2: a crawler that predates rendering refuses the record as
        # newer, instead of failing on a header field it does not know.
        rec = page(CUT, render="render_timeout")
        data = encode_page(rec)
        version, header, _ = split(data)
        assert version == 3 and header["render"] == "render_timeout"
        assert data[dom_at(data) : dom_at(data) + 4] == bytes(4)  # a DOM of 0 bytes
        got = decode_page(encode_page(rec))
        assert got == rec and got.render == "render_timeout" and got.dom == b""

    def test_a_record_written_before_rendering_decodes_with_no_render(self) -> None:
        rec = page(PLAIN)
        version, header, rest = split(encode_page(rec))
        head = json.dumps(header).encode()
        old = HEAD.pack(b"KVCP", 2, len(head)) + head + rest  # no render key: as written before
        got = decode_page(old)
        assert got.render == "" and got.dom == b"" and got.body == HTML


class TestVersion3:
    def test_a_rendered_page_is_version_3_with_the_dom_between_links_and_body(self) -> None:
        rec = page(RENDERED, render="ok", dom=DOM)
        data = encode_page(rec)
        version, header, rest = split(data)
        assert version == 3 and header["render"] == "ok" and "dom" not in header
        n = struct.unpack_from("<I", rest)[0]
        assert rest[4 : 4 + 17 * n] == rec.links
        at = 4 + 17 * n
        (dlen,) = struct.unpack_from("<I", rest, at)
        assert zlib.decompress(rest[at + 4 : at + 4 + dlen]) == DOM
        assert zlib.decompress(rest[at + 4 + dlen :]) == HTML
        got = decode_page(data)
        assert got == rec and got.dom == DOM and got.body == HTML

    def test_a_rendered_page_with_no_body_round_trips(self) -> None:
        rec = page(RENDERED, render="ok", dom=DOM, body=b"")
        assert decode_page(encode_page(rec)) == rec

    def test_without_body_the_dom_is_not_decompressed(self) -> None:
        data = encode_page(page(RENDERED, render="ok", dom=DOM))
        got = decode_page(data, with_body=False)
        assert got.dom == b"" and got.body == b""
        assert got.render == "ok" and got.links == page().links  # the rest is there
        # The DOM is skipped, never inflated: a DOM that would not decompress is not seen.
        at = dom_at(data) + 4
        garbled = data[:at] + bytes(8) + data[at + 8 :]
        assert decode_page(garbled, with_body=False).links == page().links
        with pytest.raises(zlib.error):
            decode_page(garbled)

    @pytest.mark.parametrize("keep", ["count", "half_count", "half_dom", "dom_no_body"])
    def test_a_record_cut_in_its_dom_section_raises(self, keep: str) -> None:
        data = encode_page(page(RENDERED, render="ok", dom=DOM, body=b""))
        at = dom_at(data)
        (dlen,) = struct.unpack_from("<I", data, at)
        assert at + 4 + dlen == len(data)  # no body: the DOM ends the record
        cut = {"count": at, "half_count": at + 2, "half_dom": at + 4 + dlen // 2,
               "dom_no_body": len(data) - 1}[keep]
        for with_body in (True, False):
            with pytest.raises(CrawlerError, match="cut in its DOM section"):
                decode_page(data[:cut], with_body=with_body)


def test_a_newer_version_is_refused() -> None:
    data = bytearray(encode_page(page(RENDERED, render="ok", dom=DOM)))
    data[4] = 4
    with pytest.raises(CrawlerError, match="version 4 is newer"):
        decode_page(bytes(data))


def test_rendered_crawl_holds_the_three_records(tmp_path: Path) -> None:
    from crawler.read.listing import CrawlReader

    data = rendered_crawl(tmp_path / "crawl")
    with CrawlReader(data, strict=True) as reader:
        got = {p.url: p for p in reader.pages()}
    assert got == {p.url: p for p in pages()}


# A normalized URL holds no tab, newline or carriage return; anything else may be in it
# (percent-encoded or not, non-ASCII hosts and paths, other line separators).
_URL_TEXT = st.text(st.sampled_from([chr(c) for c in range(0x20, 0x7F)]
                                    + list("\x0b\x0c\x1c\x85\u2028é中😀")),
                    min_size=1, max_size=24)


@given(st.lists(st.builds(Pending, _URL_TEXT.map(lambda s: "http://h.test/" + s),
                          st.integers(0, 10**6), st.integers(0, 20), st.integers(0, 50)),
                max_size=12))
@example([Pending("http://h.test/a b ", 3, 1, 0), Pending("http://h.test/é\x85\u2028中 ", 0, 0, 2)])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_bulks_keys_and_depths_read_from_its_bytes_are_its_decoded_urls(
    entries: list[Pending],
) -> None:
    """bulk_keys and bulk_depths (the frontier's open, retry, status --recount) read a
    bulk's bytes; they are the url_keys and depths of what decode_bulk gives."""
    data = encode_bulk(entries)
    decoded = decode_bulk(data)
    assert decoded == entries
    assert bulk_keys(data) == b"".join(url_key(e.url) for e in decoded)
    assert bulk_depths(data) == [e.depth for e in decoded]


@pytest.mark.parametrize("n", [0, 1, 25, 26, 51])
def test_put_bulks_writes_whole_bulks_in_order_from_the_counter(tmp_path: Path, n: int) -> None:
    """PendDB's one writer (the frontier, retry and reshard use it): bulks of ``size``
    entries, the last one short, keyed by counters from the one given, nothing for no
    entries; the keys read back as their counters and sort as they were written."""
    entries = [Pending(f"http://h.test/{i}", i % 7, i % 3, i % 2) for i in range(n)]
    with kvstore.open(str(tmp_path / "pend")) as pend:
        pend[bulk_key(2)] = encode_bulk([Pending("http://h.test/older")])
        keys, counter = put_bulks(pend, entries, 3, 25)
        assert keys == [bulk_key(3 + i) for i in range(-(-n // 25))]
        assert counter == 3 + len(keys)
        assert [bulk_counter(k) for k in keys] == list(range(3, counter))
        assert sorted(keys) == keys and all(k > bulk_key(2) for k in keys)
        assert [len(decode_bulk(pend[k])) for k in keys] == [
            min(25, n - i) for i in range(0, n, 25)]
        assert [e for k in keys for e in decode_bulk(pend[k])] == entries
        assert len(pend) == 1 + len(keys)
