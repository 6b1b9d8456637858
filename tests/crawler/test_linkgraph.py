"""The link graph: outlinks kept in the page records (format v2, v1 still read), the
``links`` command (outlinks and inlinks), ``pages --inlinks`` and the JSONL outlinks,
checked against the test web's own graph (the oracle's Node.links)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from crawl_helpers import REPO, run_crawl
from hypothesis import given
from hypothesis import strategies as st

import kvstore
from crawler.cli import main
from crawler.exceptions import CrawlerError
from crawler.read import export as export_module
from crawler.read.linkgraph import Resolver, inlink_counts, link_position
from crawler.read.listing import CrawlReader
from crawler.read.rankstore import RankStore
from crawler.state.pages import (
    LINK_SIZE,
    NOFOLLOW,
    PageRecord,
    decode_page,
    encode_page,
    pack_links,
)
from crawler.web.links import extract
from crawler.web.urls import url_key
from tools.testweb import SiteConfig, TestWeb, fault

A, B, C = "http://a.test/", "http://b.test/x", "http://c.test/y?q=1"


def v1_record(page: PageRecord) -> bytes:
    """A record as the crawler wrote it before outlinks were kept (format version 1)."""
    head = {k: v for k, v in page.header_dict().items() if k != "elapsed"}
    raw = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack("<4sBI", b"KVCP", 1, len(raw)) + raw + zlib.compress(page.body)


class TestRecordFormat:
    def test_links_round_trip_with_their_flags(self) -> None:
        links = pack_links([A, B], [C])
        page = PageRecord(A, 200, 1.7e9, 1, elapsed=0.25, links=links, body=b"<p>hi</p>")
        got = decode_page(encode_page(page))
        assert got == page
        assert got.link_list() == [(url_key(A), 0), (url_key(B), 0), (url_key(C), NOFOLLOW)]
        assert got.link_count() == 3 and len(got.links) == 3 * LINK_SIZE
        assert decode_page(encode_page(page), with_body=False).links == links

    def test_a_nofollow_page_marks_every_link(self) -> None:
        flags = [f for _, f in PageRecord(A, 200, 0, 0, links=pack_links(
            [A, B], [C], page_nofollow=True)).link_list()]
        assert flags == [NOFOLLOW] * 3

    def test_each_link_is_kept_once_first_flag_wins(self) -> None:
        page = PageRecord(A, 200, 0, 0, links=pack_links([A, B, A], [B, C]))
        assert page.link_list() == [(url_key(A), 0), (url_key(B), 0), (url_key(C), NOFOLLOW)]

    def test_version_1_records_decode_with_no_links(self) -> None:
        page = PageRecord(A, 200, 1.7e9, 0, outlinks=4, content_type="text/html", body=b"x")
        got = decode_page(v1_record(page))
        assert got.links == b"" and got.link_list() == [] and got.elapsed is None
        assert got.body == b"x" and got.outlinks == 4

    def test_a_cut_link_section_is_an_error(self) -> None:
        data = encode_page(PageRecord(A, 200, 0, 0, links=pack_links([A, B])))
        for cut in (len(data) - 1, len(data) - LINK_SIZE - 1):
            with pytest.raises(CrawlerError, match="link section"):
                decode_page(data[:cut])

    def test_links_that_are_not_packed_are_refused(self) -> None:
        with pytest.raises(CrawlerError, match="pack_links"):
            encode_page(PageRecord(A, 200, 0, 0, links=b"short"))

    @given(st.lists(st.text(alphabet="abcxyz/", max_size=12), max_size=40),
           st.lists(st.text(alphabet="abcxyz/", max_size=12), max_size=10), st.booleans())
    def test_round_trip_of_any_link_list(self, follow: list[str], nofollow: list[str],
                                         page_nofollow: bool) -> None:
        urls = [A + u for u in dict.fromkeys(follow)]
        skipped = [B + u for u in dict.fromkeys(nofollow)]
        page = PageRecord(A, 200, 0, 0, links=pack_links(urls, skipped,
                                                         page_nofollow=page_nofollow))
        got = decode_page(encode_page(page))
        want = [(url_key(u), NOFOLLOW if page_nofollow else 0) for u in urls]
        want += [(url_key(u), NOFOLLOW) for u in skipped]
        assert got.link_list() == want
        for i, (key, _) in enumerate(want):
            assert link_position(got.links, key) == i
        assert link_position(got.links, url_key("http://other.test/")) == -1

    def test_position_search_stays_on_key_boundaries(self) -> None:
        k1, k2 = b"\x01" * 8 + b"\x02" * 8, b"\x02" * 8 + b"\x03" * 8
        packed = k1 + k2 + b"\0\0"  # k1's tail + k2's head spell this fake key:
        assert link_position(packed, b"\x02" * 16) == -1
        assert link_position(packed, k2) == 1


def test_rel_nofollow_anchors_come_back_apart() -> None:
    body = (b'<a href="/a" rel="nofollow">a</a><a href="/b">b</a><a href="/b" rel="nofollow">'
            b'</a><a href="/c" rel="ugc nofollow"></a><a href="javascript:x" rel="nofollow"></a>')
    got = extract(body, "http://e.test/")
    assert got.links == ("http://e.test/b",)
    assert got.nofollow_links == ("http://e.test/a", "http://e.test/c")
    assert got.rejected == 4  # as before: three rel=nofollow hrefs and one bad scheme


# -- a crawl of the test web ----------------------------------------------------------------


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestWeb, Path]]:
    """A crawl limited to h0.test (links to the other hosts are off scope), with redirects
    (loops, chains, off-site), meta-robots nofollow pages and a dead host."""
    faults = [fault("redirects"), fault("meta_robots"), fault("nxdomain")]
    with TestWeb(SiteConfig(pages=120, hosts=3, seed=5, crawl_delay=0.0), faults=faults) as web:
        data = tmp_path_factory.mktemp("graph") / "crawl"
        run_crawl(web, data, broad=False, scope_hosts=frozenset({"h0.test"}))
        yield web, data


def pages_of(data: Path) -> dict[str, PageRecord]:
    with CrawlReader(data) as reader:
        return {p.url: p for p in reader.pages(with_body=False)}


def expected_links(web: TestWeb, url: str, page: PageRecord | None = None) -> set[str]:
    """The site's links of ``url``; with its record, its link to itself (#top) too, which
    the site's graph leaves out."""
    node = web.oracle.describe(url)
    assert node is not None
    own = page is not None and url_key(url) in page.link_keys()
    return set(node.links) | ({url} if own else set())


def parsed_pages(pages: dict[str, PageRecord]) -> dict[str, PageRecord]:
    return {u: p for u, p in pages.items()
            if p.status == 200 and not p.reason and "html" in p.content_type}


def test_every_parsed_page_keeps_all_its_links_once(crawl: tuple[TestWeb, Path]) -> None:
    web, data = crawl
    pages = pages_of(data)
    parsed = parsed_pages(pages)
    assert len(parsed) > 30
    off_scope = nofollow_pages = 0
    for url, page in parsed.items():
        keys = page.link_keys()
        assert len(set(keys)) == len(keys), url
        want = expected_links(web, url, page)
        assert set(keys) == {url_key(u) for u in want}, url
        flags = {f for _, f in page.link_list()}
        node = web.oracle.describe(url)
        assert node is not None
        assert flags <= ({NOFOLLOW} if node.nofollow else {0}), url  # a leaf has no links
        nofollow_pages += node.nofollow
        off_scope += sum(not u.startswith(web.url("h0.test", "/")) for u in want)
    assert off_scope > 0 and nofollow_pages > 0  # kept though never admitted
    # Nothing else carries links: redirects name their target, errors have none.
    assert all(not p.links for u, p in pages.items() if u not in parsed)


def oracle_inlinks(web: TestWeb, pages: dict[str, PageRecord], target: str) -> set[str]:
    """The recorded pages that link or redirect to ``target``, from the site's graph."""
    out = set()
    for url, page in pages.items():
        if page.status == 200 and url in parsed_pages({url: page}):
            if target in expected_links(web, url, page):
                out.add(url)
        elif 300 <= page.status < 400:
            node = web.oracle.describe(url)
            if node is not None and node.location == target:
                out.add(url)
    return out


def test_links_command_shows_outlinks_and_inlinks(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    pages = pages_of(data)
    seed = web.seed_url
    assert main(["links", str(data), seed]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    out = [r for r in rows if r[0] == "out"]
    inl = [r for r in rows if r[0] == "in"]
    assert len(out) == pages[seed].link_count()
    for _, status, _, where in out:
        if where.startswith("key:"):
            assert status == "-" and bytes.fromhex(where[4:]) not in {
                url_key(u) for u in pages}
        else:
            assert where in expected_links(web, seed, pages[seed])
            assert int(status) == pages[where].status
    assert any(w.startswith("key:") for *_, w in out)  # off-scope targets: only keys known
    assert {r[3] for r in inl} == oracle_inlinks(web, pages, seed)

    # A redirect's outlink is its target; the target lists the redirect as an inlink.
    redirect = next(u for u, p in pages.items() if p.status == 301 and "/x/redirects/chain/"
                    in u and pages.get(p.redirect))
    target = pages[redirect].redirect
    assert main(["links", str(data), redirect, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["outlinks"] == [{"url": target, "nofollow": False, "redirect": True,
                                "status": pages[target].status}]
    assert {i["url"] for i in obj["inlinks"]} == oracle_inlinks(web, pages, redirect)
    assert main(["links", str(data), target, "--json"]) == 0
    inl_json = json.loads(capsys.readouterr().out)["inlinks"]
    assert {"url": redirect, "nofollow": False, "redirect": True, "status": 301} in inl_json


def test_links_command_errors(crawl: tuple[TestWeb, Path],
                              capsys: pytest.CaptureFixture[str]) -> None:
    web, data = crawl
    assert main(["links", str(data), web.url("h0.test", "/never.html")]) == 1
    assert "not in the crawl" in capsys.readouterr().err
    assert main(["links", str(data), "ftp://x/"]) == 1
    assert "bad URL" in capsys.readouterr().err
    assert main(["links", str(data)]) == 2
    assert main(["links", "--help"]) == 0
    assert "example: python -m crawler links" in capsys.readouterr().out


def test_pages_inlinks_counts_match_the_graph(
    crawl: tuple[TestWeb, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    web, data = crawl
    pages = pages_of(data)
    assert main(["pages", str(data), "--inlinks"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == len(pages) and all(len(r) == 5 for r in rows)
    got = {r[4]: int(r[3]) for r in rows}
    want = {u: len(oracle_inlinks(web, pages, u)) for u in pages}
    assert got == want
    assert max(got.values()) > 5


def test_jsonl_carries_the_outlinks(crawl: tuple[TestWeb, Path], tmp_path: Path) -> None:
    web, data = crawl
    pages = pages_of(data)
    out = tmp_path / "p.jsonl"
    assert main(["export", str(data), "--jsonl", str(out), "--quiet"]) == 0
    objs = {o["url"]: o for o in map(json.loads, out.read_text().splitlines())}
    recorded = {url_key(u): u for u in pages}
    for url, obj in objs.items():
        page = pages[url]
        assert len(obj["links"]) == page.link_count()
        for item, (key, flags) in zip(obj["links"], page.link_list(), strict=True):
            assert item["nofollow"] == bool(flags & NOFOLLOW)
            if key in recorded:
                assert item == {"url": recorded[key], "nofollow": item["nofollow"]}
            else:
                assert item == {"key": key.hex(), "nofollow": item["nofollow"]}
        assert obj["elapsed"] == page.elapsed
        assert (obj["elapsed"] is not None) == (page.status > 0)


def test_inlink_counts_and_resolver_on_a_hand_made_store(tmp_path: Path) -> None:
    data = tmp_path / "c"
    data.mkdir()
    recs = [
        PageRecord(A, 200, 0, 0, links=pack_links([B, C, "http://off.test/"])),
        PageRecord(B, 200, 0, 1, links=pack_links([A], [C])),
        PageRecord(C, 301, 0, 1, redirect=A),
        v1_record(PageRecord("http://old.test/", 200, 0, 0)),  # type: ignore[list-item]
    ]
    with kvstore.open(data / "main") as db:
        for rec in recs:
            if isinstance(rec, bytes):
                db[url_key("http://old.test/")] = rec
            else:
                db[url_key(rec.url)] = encode_page(rec)
    with CrawlReader(data) as reader:
        counts = inlink_counts(reader)
        assert {k: counts[k] for k in counts} == {url_key(A): 2, url_key(B): 1, url_key(C): 2}
        resolve = Resolver(reader, cache_size=2)
        assert [resolve(url_key(u)) for u in (A, B, "http://off.test/", A)] == [
            A, B, None, A]
        assert len(resolve._cache) == 2


def test_jsonl_links_and_ranks_in_batches_with_a_rank_store_older_than_some_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Export resolves a batch of pages' links at once: the rank store's URLs, then
    MainDB for a page recorded since the rank run, a key for a URL never recorded; every
    line's links and rank in place however the batches fall."""
    data = tmp_path / "c"
    data.mkdir()
    d, off = "http://d.test/since", "http://off.test/"
    first = [PageRecord(A, 200, 0, 0, links=pack_links([B, C, d, off, B])),
             PageRecord(B, 200, 0, 1, links=pack_links([A], [C, off])),
             PageRecord(C, 301, 0, 1, redirect=A), PageRecord("http://e.test/", 0, 0, 1)]
    later = [PageRecord(d, 200, 0, 1, links=pack_links([A, "http://off2.test/", d])),
             *(PageRecord(f"http://f.test/{i}", 200, 0, 2, links=pack_links([B, d][: i % 3]))
               for i in range(7))]
    with kvstore.open(data / "main") as db:
        for rec in first:
            db[url_key(rec.url)] = encode_page(rec)
    assert main(["rank", str(data), "--quiet"]) == 0
    with kvstore.open(data / "main") as db:
        for rec in later:
            db[url_key(rec.url)] = encode_page(rec)
    recorded = {url_key(r.url): r.url for r in first + later}
    with RankStore(str(data)) as ranks:
        keys = [url_key(u) for u in (A, d, off, B, A, C, "http://e.test/")]
        packed = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16)
        assert ranks.urls(packed) == [ranks.url(k) for k in keys] == [
            A, None, None, B, A, C, "http://e.test/"]
        assert ranks.ranks(packed) == [ranks.get(k) for k in keys]
        assert [r is not None for r in ranks.ranks(packed)] == [1, 0, 0, 1, 1, 1, 0]
        want_ranks = {u: ranks.get(url_key(u)) for u in recorded.values()}
    for pages, links in ((2, 3), (3, 1), (512, 1 << 14)):
        monkeypatch.setattr(export_module, "_BATCH_PAGES", pages)
        monkeypatch.setattr(export_module, "_BATCH_LINKS", links)
        out = tmp_path / f"p{pages}.jsonl"
        assert main(["export", str(data), "--jsonl", str(out), "--quiet"]) == 0
        objs = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(o["url"] for o in objs) == sorted(recorded.values())
        for obj in objs:
            page = next(r for r in first + later if r.url == obj["url"])
            want = [({"url": recorded[k]} if k in recorded else {"key": k.hex()})
                    | {"nofollow": bool(f & NOFOLLOW)} for k, f in page.link_list()]
            assert obj["links"] == want
            rank = want_ranks[obj["url"]]
            assert (obj["rank"], obj["rank_scaled"]) == (
                (rank.raw, round(rank.scaled, 4)) if rank else (None, None))
            assert list(obj)[-4:] == ["elapsed", "links", "rank", "rank_scaled"]


def test_docs_name_the_command() -> None:
    assert "python -m crawler links DIR URL" in (REPO / "docs" / "REPORT.md").read_text()
