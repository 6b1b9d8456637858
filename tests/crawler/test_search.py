"""``index`` and ``search`` on a site whose pages say known words: the oracle knows which
pages match each query (by their main text, title, URL, or the anchor text of the links
to them), what boilerplate must not match, and what a recrawl changes."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from crawl_helpers import META_PATHS, Answer, Hit, LocalServer, run_cli, run_crawl
from test_report import chromium

from crawler.read.rankstore import RankStore
from crawler.read.serve import ReportServer
from crawler.search.indexer import index_crawl
from crawler.search.page import search_page
from crawler.search.query import MAX_QUERY, QueryError, Searcher
from crawler.search.sitecheck import site_checks
from crawler.web.urls import url_key
from tools.testweb import SiteConfig, TestWeb

# path -> (title, main text, links as (href, text, rel)); every page also has the same
# navigation, aside and footer (boilerplate: words no search finds a page by, but the
# navigation's links are links: their text is anchor text for the pages they point to).
PAGES: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {
    "/": ("Welcome portal", "garnet opal words of the front page about minerals",
          [("/quartz.html", "quartz crystals", ""), ("/mica.html", "sheet silicate", ""),
           ("/basalt.html", "volcanic rock", ""), ("/granite.html", "granite", ""),
           ("/secret.html", "zebrastripe", "nofollow"), ("/twin-a.html", "twin", ""),
           ("/twin-b.html", "twin too", ""), ("/hidden.html", "hidden", ""),
           ("/gone.html", "gone", ""), ("/lost.html", "lost", ""),
           ("/english.html", "field notes", ""), ("/german.html", "river page", "")]),
    "/quartz.html": ("Quartz", "quartz is a hard mineral made of silicon and oxygen atoms, "
                     "common in granite and sandstone", [("/mica.html", "glimmer", "")]),
    "/mica.html": ("Mica sheets", "mica splits into thin elastic sheets, a silicate "
                   "found in granite", []),
    "/basalt.html": ("Basalt", "basalt is a fine grained volcanic rock, dark and dense; "
                     "oceanic crust is mostly basalt", []),
    "/granite.html": ("Granite", "granite is coarse grained; its minerals are quartz, "
                      "feldspar and mica", [("/secret.html", "stonewall", "")]),
    "/secret.html": ("Unlinked words", "a page about obsidian glass", []),
    "/twin-a.html": ("Twin page one", "identical article text about pumice: a light porous "
                     "volcanic glass that floats on water " * 5, []),
    "/twin-b.html": ("Twin page one", "identical article text about pumice: a light porous "
                     "volcanic glass that floats on water " * 5, []),
    "/hidden.html": ("Hidden page", "tuff is rock made of volcanic ash", []),
    "/gone.html": ("Gone soon", "serpentine is a green mineral group", []),
    "/english.html": ("Field notes", "The crawlers were crawling the websites slowly; each "
                      "crawler politely waited between its requests while the operators "
                      "watched the running crawls closely from their desks.", []),
    "/german.html": ("Am Fluss", "Die alten Häuser der Stadt stehen am Fluss, und die Kinder "
                     "spielen in den Gärten hinter den Häusern bis zum Abend.", []),
}
NOINDEX = {"/hidden.html"}
# what the report's site checks find (crawler.search.sitecheck): /lost.html is a 404
DESCRIPTIONS = {"/": "rocks and minerals", "/basalt.html": "rocks and minerals",
                "/granite.html": "all about granite"}
CANONICAL = {"/mica.html": "/lost.html", "/quartz.html": "/quartz.html"}
CHANGED = {"/basalt.html": ("Basalt", "basalt was rewritten: now it speaks of lava flows "
                            "and columnar jointing", [])}
BOILERPLATE = ("<header><nav><a href=\"/\">zzmenu home</a> <a href=\"/quartz.html\">"
               "zzmenu quartz</a></nav></header>", "<aside>zzside related reading</aside>"
               "<footer>zzfooter copyright 2026 rocks inc</footer>")


def page_html(path: str, version: int) -> bytes:
    pages = {**PAGES, **CHANGED} if version > 1 else PAGES
    title, text, links = pages[path]
    anchors = "".join(f'<li><a href="{href}"{f" rel={rel}" if rel else ""}>{words}</a></li>'
                      for href, words, rel in links)
    robots = '<meta name="robots" content="noindex">' if path in NOINDEX else ""
    if path in DESCRIPTIONS:
        robots += f'<meta name="description" content="{DESCRIPTIONS[path]}">'
    if path in CANONICAL:
        robots += f'<link rel="canonical" href="{CANONICAL[path]}">'
    nav, foot = BOILERPLATE
    # twin-b's boilerplate differs from twin-a's: only the main text is the same
    if path == "/twin-b.html":
        nav = nav.replace("zzmenu home", "start page")
    return (f"<!DOCTYPE html><html lang=en><head><title>{title}</title>{robots}</head>"
            f"<body>{nav}<main><article><h1>{title}</h1><p>{text}</p>"
            f"<ul>{anchors}</ul></article></main>{foot}</body></html>").encode()


class Rocks:
    """The site, served by a LocalServer; ``version`` 2 changes basalt and drops gone."""

    def __init__(self) -> None:
        self.version = 1

    def answer(self, path: str, hits: list[Hit]) -> Answer:
        if path in META_PATHS or path not in PAGES or (
                self.version > 1 and path == "/gone.html"):
            return 404, [("Content-Type", "text/plain")], b"not here"
        return 200, [("Content-Type", "text/html; charset=utf-8")], page_html(path,
                                                                             self.version)


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def oracle(word: str, base: str, version: int = 1) -> set[str]:
    """The pages a one-word query must find: its title, main text or description says
    it, or a followed link to it does (anchor text); never by boilerplate, a menu's
    links included (they would give every page "Home" and "Next"); never noindex."""
    pages = {**PAGES, **CHANGED} if version > 1 else PAGES
    found = set()
    for path, (title, text, _) in pages.items():
        if version > 1 and path == "/gone.html":
            continue
        if word in words(title) | words(text) | words(DESCRIPTIONS.get(path, "")):
            found.add(path)
    for path, (_, _, links) in pages.items():
        for href, anchor, rel in links:
            if (rel != "nofollow" and word in words(anchor) and href != path
                    and href in pages):
                found.add(href)
    if version > 1:
        found.discard("/gone.html")
    return {base + p for p in found - NOINDEX}


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    web = TestWeb(SiteConfig(hosts=1, pages=5, seed=3, crawl_delay=0.0)).start()
    yield web  # only for the crawl's settings (DNS, CA); the pages are local
    web.stop()


@pytest.fixture(scope="module")
def rocks(web: TestWeb, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Path, str]]:
    site = Rocks()
    data = tmp_path_factory.mktemp("rocks") / "crawl"
    with LocalServer(site.answer) as server:
        assert run_crawl(web, data, seeds=[server.url("/")]).complete
        base = server.url("")
    stats = index_crawl(str(data))
    assert stats.indexed == len(PAGES) - len(NOINDEX), stats
    yield data, base


def found(data: Path, query: str, **kw: object) -> set[str]:
    """The URLs a query finds, near-duplicates folded: twin-b stands for the twin pair,
    whichever of the two the search shows (they score the same)."""
    with Searcher(str(data)) as s:
        urls = [h.url for h in s.search(query, limit=100, **kw).hits]  # type: ignore[arg-type]
    folded = {re.sub(r"/twin-a\.html$", "/twin-b.html", u) for u in urls}
    assert len(folded) == len(urls), f"both twins shown: {urls}"
    return folded


@pytest.mark.parametrize("word", ["quartz", "granite", "mica", "silicate", "volcanic",
                                  "glimmer", "obsidian", "garnet", "feldspar",
                                  "oxygen", "welcome", "serpentine"])
def test_a_word_finds_exactly_the_pages_that_say_it(rocks: tuple[Path, str],
                                                     word: str) -> None:
    data, base = rocks
    want = {re.sub(r"/twin-a\.html$", "/twin-b.html", u) for u in oracle(word, base)}
    assert found(data, word) == want and want


@pytest.mark.parametrize("word", ["zzside", "zzfooter", "zzmenu", "tuff", "zebrastripe",
                                  "nowhereword"])
def test_boilerplate_noindex_and_nofollow_anchor_text_find_nothing(
        rocks: tuple[Path, str], word: str) -> None:
    data, _ = rocks
    assert found(data, word) == set()


def test_anchor_text_finds_a_page_that_does_not_say_the_words(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    assert "stonewall" not in words(PAGES["/secret.html"][1])
    assert found(data, "stonewall") == {base + "/secret.html"}
    assert found(data, "anchors:glimmer") == {base + "/mica.html"}
    assert found(data, "body:glimmer") == set()


def test_phrases_fields_and_the_best_match_first(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    assert found(data, '"volcanic rock"') == {base + "/basalt.html"}  # and its anchor
    assert found(data, '"rock volcanic"') == set()
    assert found(data, "title:granite") == {base + "/granite.html"}
    assert found(data, "granite -quartz") == {base + "/mica.html"}
    with Searcher(str(data)) as s:
        res = s.search("granite", limit=1)
        assert res.hits[0].url == base + "/granite.html"  # in its title: boosted
        assert res.matches == len(oracle("granite", base))
        hit = res.hits[0]
        marked = [hit.snippet[a:b].lower() for a, b in hit.highlights]
        assert marked and set(marked) == {"granite"}
        assert hit.lang == "en" and hit.pagerank is None and hit.score == hit.bm25


def test_near_duplicates_show_once(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    with Searcher(str(data)) as s:
        hits = s.search("pumice").hits
    assert len(hits) == 1
    pair = {hits[0].url, *hits[0].duplicates}
    assert pair == {base + "/twin-a.html", base + "/twin-b.html"}


def test_filters_by_host_and_language(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    assert found(data, "granite", host="127.0.0.1") == oracle("granite", base)
    assert found(data, "granite", host="elsewhere.test") == set()
    assert found(data, "granite", lang="en") == oracle("granite", base)
    assert found(data, "granite", lang="de") == set()


def test_a_second_run_reads_nothing_new(rocks: tuple[Path, str]) -> None:
    data, _ = rocks
    again = index_crawl(str(data))
    assert (again.read, again.indexed, again.removed) == (0, 0, 0)
    assert again.documents == len(PAGES) - len(NOINDEX)


def test_a_recrawl_updates_the_index_with_what_changed(web: TestWeb, tmp_path: Path) -> None:
    site = Rocks()
    data = tmp_path / "crawl"
    with LocalServer(site.answer) as server:
        base = server.url("")
        assert run_crawl(web, data, seeds=[server.url("/")]).complete
        index_crawl(str(data))
        assert found(data, "oceanic") == {base + "/basalt.html"}
        site.version = 2
        done = run_cli(["python", "-m", "crawler", "recrawl", str(data), "--older-than",
                        "0s"])
        assert done.returncode == 0, done.stderr
        assert run_crawl(web, data, seeds=[server.url("/")]).complete
    stats = index_crawl(str(data))
    # the two changed pages were read again; the unchanged ones were 304s, which are
    # records written again too (a new fetch time), so they are read: but not the
    # noindex page's neighbours beyond them
    assert stats.removed == 1  # gone.html is a 404 now
    assert found(data, "oceanic") == set()
    assert found(data, "jointing") == {base + "/basalt.html"}
    assert found(data, "serpentine") == set()
    for word in ("quartz", "granite", "volcanic", "stonewall"):
        want = {re.sub(r"/twin-a\.html$", "/twin-b.html", u) for u in oracle(word, base, 2)}
        assert found(data, word) == want, word


def test_bad_queries_are_one_line_errors(rocks: tuple[Path, str]) -> None:
    data, _ = rocks
    with Searcher(str(data)) as s:
        # (what tantivy cannot read but has words, "title:(granite", is searched as its
        # words: test_untrusted_files.py)
        for bad in ("", "   ", "x" * (MAX_QUERY + 1), "granite\x00", "a\x1bb", "((", "-*"):
            with pytest.raises(QueryError):
                s.search(bad)
    for bad in ("((", "x" * 10_000, "a\x07b"):
        done = run_cli(["python", "-m", "crawler", "search", str(data), bad])
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("crawler: error: search:"), lines
        assert "Traceback" not in done.stderr


def test_the_cli_prints_ranked_results_and_json(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    done = run_cli(["python", "-m", "crawler", "search", str(data), "granite", "--json",
                    "--limit", "2"])
    assert done.returncode == 0, done.stderr
    res = json.loads(done.stdout)
    assert res["matches"] == len(oracle("granite", base)) and len(res["hits"]) == 2
    first = res["hits"][0]
    assert first["url"] == base + "/granite.html" and first["title"] == "Granite"
    assert set(first) >= {"snippet", "highlights", "score", "bm25", "pagerank", "lang"}
    scores = [h["score"] for h in res["hits"]]
    assert scores == sorted(scores, reverse=True)
    text = run_cli(["python", "-m", "crawler", "search", str(data), "granite"])
    assert text.returncode == 0, text.stderr
    assert "1. Granite" in text.stdout and "**granite**" in text.stdout.lower()
    assert f"of {len(oracle('granite', base))} matching pages" in text.stdout


def test_search_without_an_index_says_how_to_make_one(web: TestWeb, tmp_path: Path) -> None:
    site = Rocks()
    data = tmp_path / "crawl"
    with LocalServer(site.answer) as server:
        assert run_crawl(web, data, seeds=[server.url("/")]).complete
    done = run_cli(["python", "-m", "crawler", "search", str(data), "granite"])
    assert done.returncode == 1
    assert done.stderr.strip() == (f"crawler: error: {data}: no search index; make one "
                                   f"with: python -m crawler index {data}")


def test_the_search_page_in_chromium(rocks: tuple[Path, str], tmp_path: Path) -> None:
    data, base = rocks
    server = ReportServer(str(data), port=0, search=functools.partial(search_page, str(data)))
    server.start()
    # the browser reaches our server and nothing else (the last rule given is the one kept)
    only_us = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
    try:
        url = server.url + "search?" + urllib.parse.urlencode({"q": "granite", "limit": 3})
        with urllib.request.urlopen(url, timeout=30) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'")
        dom, console = chromium(tmp_path, url, only_us, "--dump-dom")
        assert console == ""
        links = re.findall(r'<li><a href="([^"]+)">([^<]*)</a>', dom)
        assert links[0] == (base + "/granite.html", "Granite") and len(links) == 3
        assert "<mark>granite</mark>" in dom.lower()
        assert f"3 of {len(oracle('granite', base))} matching pages" in dom
        assert not re.search(r"<(?:script|img|iframe|link|object)\b", dom)
        hostile = "<script>alert(1)</script> granite"
        dom, console = chromium(tmp_path, server.url + "search?" + urllib.parse.urlencode(
            {"q": hostile}), only_us, "--dump-dom")
        assert "<script" not in dom and "&lt;script&gt;" in dom and console == ""
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(server.url + "search?q=%28%28", timeout=30)
        assert bad.value.code == 400 and b"cannot read the query" in bad.value.read()
        bad.value.close()
        dom, _ = chromium(tmp_path, server.url + "search", only_us, "--dump-dom")
        assert '<form method="get" action="/search">' in dom and "<ol>" not in dom
    finally:
        server.stop()


def test_export_markdown_writes_each_page_main_content(rocks: tuple[Path, str],
                                                       tmp_path: Path) -> None:
    data, base = rocks
    out = tmp_path / "md"
    done = run_cli(["python", "-m", "crawler", "export", str(data), "--markdown", str(out),
                    "--quiet"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out}" and not (tmp_path / "md.part").exists()
    files = sorted(out.rglob("*.md"))
    assert {f.parent.name for f in files} == {"127.0.0.1"}
    seen = {}
    for f in files:
        head, sep, body = f.read_text(encoding="utf-8").removeprefix("---\n").partition(
            "\n---\n\n")
        assert sep, f
        meta = {k: json.loads(v) for k, _, v in (ln.partition(": ") for ln in head.split("\n"))}
        assert set(meta) == {"title", "url", "fetched", "lang"} and isinstance(meta["lang"], str)
        path = meta["url"][len(base):]
        assert f.name == url_key(meta["url"]).hex() + ".md"
        title, text, _ = PAGES[path]
        assert meta["title"] == title
        assert body.startswith(f"# {title}\n") and text.split()[2] in body
        assert not {"zzfooter", "zzside", "zzmenu"} & words(body), path
        seen[path] = body
    assert set(seen) == set(PAGES) - NOINDEX
    again = run_cli(["python", "-m", "crawler", "export", str(data), "--markdown", str(out)])
    assert again.returncode == 1 and again.stderr.strip().splitlines() == [
        f"crawler: error: --markdown {out}: exists: give --force to replace it"]
    failed = run_cli(["python", "-m", "crawler", "export", str(data), "--markdown",
                      str(tmp_path / "md2"), "--jsonl", str(tmp_path / "no" / "x.jsonl")])
    assert failed.returncode == 1 and "does not exist" in failed.stderr
    assert not (tmp_path / "md2").exists() and not (tmp_path / "md2.part").exists()


def test_the_report_lists_what_a_site_owner_fixes(rocks: tuple[Path, str],
                                                  tmp_path: Path) -> None:
    data, base = rocks
    found = site_checks(str(data))
    assert found is not None
    indexed = set(PAGES) - NOINDEX
    assert found["pages"] == len(indexed)
    assert found["missing_title"]["count"] == 0
    twins = {base + "/twin-a.html", base + "/twin-b.html"}
    dt = found["duplicate_titles"]
    assert (dt["groups"], dt["pages"]) == (1, 2) and set(dt["top"][0]["urls"]) == twins
    assert dt["top"][0]["title"] == "Twin page one"
    dd = found["duplicate_descriptions"]
    assert (dd["groups"], dd["pages"]) == (1, 2)
    assert set(dd["top"][0]["urls"]) == {base + "/", base + "/basalt.html"}
    assert found["missing_description"]["count"] == len(indexed - set(DESCRIPTIONS))
    c = found["canonical"]
    assert (c["pages"], c["bad"]) == (1, 1)  # quartz's canonical is itself: not counted
    assert c["top"] == [{"url": base + "/mica.html", "canonical": base + "/lost.html",
                         "status": 404, "problem": "error"}]
    nd = found["near_duplicates"]
    assert (nd["groups"], nd["pages"]) == (1, 2) and set(nd["top"][0]["urls"]) == twins
    out = tmp_path / "report.html"
    done = run_cli(["python", "-m", "crawler", "report", str(data), "--out", str(out),
                    "--quiet"])
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert '<section id="site">' in page and "rocks and minerals" in page
    assert f"{base}/lost.html" in page


def test_words_are_found_by_their_stem_in_the_page_language(rocks: tuple[Path, str]) -> None:
    data, base = rocks
    # no page says "crawl" or "haus": the English and German stemmers find them
    assert not {"crawl", "haus"} & set().union(*(words(t) for _, t, _ in PAGES.values()))
    assert found(data, "crawl") == {base + "/english.html"}
    assert found(data, "haus") == {base + "/german.html"}
    assert found(data, "haus", lang="de") == {base + "/german.html"}
    assert found(data, "haus", lang="en") == set()
    with Searcher(str(data), stemmed=False) as s:
        assert s.search("crawl").hits == [] and s.search("haus").hits == []
    with Searcher(str(data)) as s:  # the exact word scores above its stem alone
        hits = s.search("crawling").hits
        assert [h.url for h in hits] == [base + "/english.html"] and hits[0].lang == "en"


def test_pagerank_is_blended_as_documented(rocks: tuple[Path, str], tmp_path: Path) -> None:
    data = tmp_path / "ranked"
    shutil.copytree(rocks[0], data)
    done = run_cli(["python", "-m", "crawler", "rank", str(data), "--quiet"])
    assert done.returncode == 0, done.stderr
    with RankStore(str(data)) as ranks:
        n = ranks.graph["fetched"]
        pagerank = {url: ranks.get(url_key(url)) for url in found(data, "granite")}
    assert n > 5 and all(r is not None for r in pagerank.values())
    for weight in (0.0, 0.1, 3.0):
        with Searcher(str(data), rank_weight=weight) as s:
            hits = s.search("granite", limit=20).hits
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        for h in hits:
            raw = pagerank[h.url].raw  # type: ignore[union-attr]
            assert h.pagerank == raw
            assert h.score == pytest.approx(h.bm25 * (1 + weight * math.log2(1 + n * raw)))
