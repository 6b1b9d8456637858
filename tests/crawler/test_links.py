"""crawler.web.links: every extraction rule on small hand-written pages, robustness on hostile
bodies (deep nesting on a 256 KiB thread stack, 10 MB, NULs, junk), and extraction from
real testweb pages checked against the site's own link graph (the oracle's Node.links)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from crawler.exceptions import URLError
from crawler.web import links as links_mod
from crawler.web.links import (
    PageLinks,
    extract,
    is_html,
    robots_directives,
    sniff_charset,
)
from crawler.web.urls import normalize
from tools.testweb import TestWeb, fault
from tools.testweb.urls import split

PAGE = "http://e.com/dir/page.html"
SMALL_STACK = 256 * 1024


def html(body: str, head: str = "") -> bytes:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>".encode()


def links_of(body: bytes | str, url: str = PAGE, **kw: Any) -> tuple[str, ...]:
    data = body.encode() if isinstance(body, str) else body
    return extract(data, url, **kw).links


def in_small_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread with the crawler's 256 KiB stack; re-raise its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    old = threading.stack_size(SMALL_STACK)
    try:
        t = threading.Thread(target=run)
        t.start()
    finally:
        threading.stack_size(old)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class TestIsHtml:
    @pytest.mark.parametrize(("ctype", "want"), [
        ("text/html", True),
        ("text/html; charset=utf-8", True),
        ("TEXT/HTML;charset=ISO-8859-1", True),
        ("application/xhtml+xml", True),
        (" text/html ", True),
        ("text/plain", False),
        ("text/plain; charset=utf-8", False),
        ("image/png", False),
        ("application/pdf", False),
        ("application/octet-stream", False),
        ("application/xml", False),
        ("text/css", False),
    ])
    def test_by_type_regardless_of_body(self, ctype: str, want: bool) -> None:
        assert is_html(ctype, b"<!DOCTYPE html><html>") is want
        assert is_html(ctype, b"\x89PNG\r\n\x1a\n") is want

    @pytest.mark.parametrize(("head", "want"), [
        (b"<!DOCTYPE html>\n<html>", True),
        (b"  \n\t<html lang=en>", True),
        (b"<HTML>", True),
        (b"\xef\xbb\xbf<html>", True),
        (b"<!-- c --><p>x", True),
        (b"<a href=x>", True),
        (b"<body>", True),
        (b"<table>", True),
        (b"<?xml version='1.0'?><rss>", False),
        (b"\x89PNG\r\n\x1a\n", False),
        (b"%PDF-1.4", False),
        (b"plain text <html>", False),
        (b"<abbr>", False),
        (b"", False),
    ])
    def test_sniffed_when_the_type_is_missing(self, head: bytes, want: bool) -> None:
        assert is_html(None, head) is want
        assert is_html("", head) is want
        assert is_html("nonsense", head) is want


class TestCharset:
    @pytest.mark.parametrize(("ctype", "body", "want"), [
        (None, b"<html>", "utf-8"),
        ("text/html; charset=utf-8", b"", "utf-8"),
        ("text/html; charset=\"KOI8-R\"", b"", "koi8-r"),
        ("text/html;charset=iso-8859-1", b"", "cp1252"),
        ("text/html; charset=us-ascii", b"", "cp1252"),
        ("text/html; charset=shift_jis", b"", "cp932"),
        ("text/html; charset=gb2312", b"", "gb18030"),
        ("text/html; charset=no-such-codec", b"<meta charset=koi8-r>", "koi8-r"),
        ("text/html; charset=base64", b"", "utf-8"),
        ("text/html; charset=utf-7", b"", "utf-8"),
        ("text/html; charset=unicode_escape", b"", "utf-8"),
        ("text/html", b'<meta charset="windows-1251">', "cp1251"),
        ("text/html", b"<meta http-equiv='Content-Type' content='text/html; charset=koi8-r'>",
         "koi8-r"),
        ("text/html", b"<META CHARSET=UTF-16>", "utf-8"),
        ("text/html", b"<!-- <meta charset=koi8-r> --><meta charset=cp1251>", "cp1251"),
        ("text/html", b" " * 5000 + b"<meta charset=koi8-r>", "utf-8"),
        ("text/html; charset=iso-8859-1", b"<meta charset=utf-8>", "cp1252"),
        ("text/html; charset=iso-8859-1", b"\xef\xbb\xbf<meta charset=koi8-r>", "utf-8"),
        (None, b"\xff\xfe<\x00h\x00", "utf-16-le"),
        (None, b"\xfe\xff\x00<\x00h", "utf-16-be"),
    ])
    def test_sniff(self, ctype: str | None, body: bytes, want: str) -> None:
        assert sniff_charset(ctype, body) == want

    def test_header_charset_decodes_the_links(self) -> None:
        body = '<a href="café">x</a>'.encode("latin-1")
        got = extract(body, PAGE, content_type="text/html; charset=ISO-8859-1")
        assert got.links == ("http://e.com/dir/caf%C3%A9",)
        assert got.charset == "cp1252"

    def test_meta_charset_decodes_the_links(self) -> None:
        body = ('<html><head><meta http-equiv="Content-Type" content="text/html; '
                'charset=koi8-r"></head><a href="/привет">x</a>').encode("koi8-r")
        got = extract(body, PAGE, content_type="text/html")
        assert got.links == ("http://e.com/%D0%BF%D1%80%D0%B8%D0%B2%D0%B5%D1%82",)
        assert got.charset == "koi8-r"

    def test_header_wins_over_meta(self) -> None:
        body = '<meta charset="utf-8"><a href="/señal">x</a>'.encode("latin-1")
        got = extract(body, PAGE, content_type="text/html; charset=iso-8859-1")
        assert got.links == ("http://e.com/se%C3%B1al",)

    def test_utf16_with_bom(self) -> None:
        body = '<a href="/ü">x</a>'.encode("utf-16")  # starts with a BOM
        assert links_of(body) == ("http://e.com/%C3%BC",)

    def test_undeclared_bad_bytes_become_replacement_characters(self) -> None:
        body = b'<p>caf\xe9 \xff\xfe\x80</p><a href="/ok">x</a><a href="/x\xe9y">y</a>'
        got = extract(body, PAGE)
        assert got.charset == "utf-8"
        assert got.links == ("http://e.com/ok", "http://e.com/x%EF%BF%BDy")

    def test_wrong_declared_charset_never_raises(self) -> None:
        body = b'<a href="/a">x</a>\xff\xfe\xfd\x00\x81<a href="/b">'
        for cs in ("utf-8", "shift_jis", "utf-16", "ascii", "koi8-r", "big5"):
            got = extract(body, PAGE, content_type=f"text/html; charset={cs}")
            assert isinstance(got, PageLinks)


class TestElements:
    def test_a_area_frame_iframe_in_document_order(self) -> None:
        body = html(
            '<a href="/1">a</a><map><area href="/2"></map><iframe src="/3"></iframe>'
            '<a href="/1#again">dup</a><link rel="stylesheet" href="/style.css">'
            '<img src="/img.png"><script src="/s.js"></script><a>no href</a>'
            '<a name="anchor">x</a><form action="/form"></form>',
            head='<link rel="alternate" href="/feed">',
        )
        assert links_of(body) == ("http://e.com/1", "http://e.com/2", "http://e.com/3")
        frameset = b'<html><frameset><frame src="left.html"><frame src="/right"></frameset>'
        assert links_of(frameset) == ("http://e.com/dir/left.html", "http://e.com/right")

    def test_relative_forms_resolve_against_the_page(self) -> None:
        body = html('<a href="p7.html"></a><a href="../up.html"></a><a href="/root"></a>'
                    '<a href="//other.com/x"></a><a href="?q=2"></a><a href="./"></a>'
                    '<a href="HTTP://E.COM:80/Case"></a>')
        assert links_of(body) == (
            "http://e.com/dir/p7.html", "http://e.com/up.html", "http://e.com/root",
            "http://other.com/x", "http://e.com/dir/page.html?q=2", "http://e.com/dir/",
            "http://e.com/Case",
        )

    def test_fragment_and_empty_hrefs_are_the_page_itself(self) -> None:
        got = links_of(html('<a href="#top">t</a><a href="">e</a><a href="#">h</a>'),
                       url="http://e.com/p?x=1#frag")
        assert got == ("http://e.com/p?x=1",)

    def test_duplicates_are_dropped_after_normalization(self) -> None:
        body = html('<a href="/a b"></a><a href="/a%20b#x"></a><a href="http://E.com/a%20b">'
                    '</a><a href="/a/../a b"></a>')
        assert links_of(body) == ("http://e.com/a%20b",)

    def test_other_schemes_are_rejected_and_counted(self) -> None:
        body = html(
            '<a href="javascript:void(0)"></a><a href="mailto:a@e.com"></a>'
            '<a href="data:text/html,&lt;a href=/x&gt;"></a><a href="tel:+1555"></a>'
            '<a href="ftp://e.com/f"></a><a href=" JavaScript:alert(1)"></a>'
            '<a href="http://[bad/"></a><a href="http://e.com:99999/"></a><a href="/ok"></a>'
        )
        got = extract(body, PAGE)
        assert got.links == ("http://e.com/ok",)
        assert got.rejected == 8

    def test_whitespace_entities_and_odd_characters(self) -> None:
        body = html('<a href="  /spaces  ">1</a><a href="&#47;entity&amp;x=1">2</a>'
                    '<a href="/sp ace">3</a><a href="/tab\there\n">4</a><a href="/q?a=&quot;">5</a>'
                    '<a href="/üñí">6</a><a href="\\back\\slash">7</a>')
        assert links_of(body) == (
            "http://e.com/spaces", "http://e.com/entity&x=1", "http://e.com/sp%20ace",
            "http://e.com/tabhere", "http://e.com/q?a=%22", "http://e.com/%C3%BC%C3%B1%C3%AD",
            "http://e.com/back/slash",
        )

    def test_idn_hosts_become_punycode(self) -> None:
        body = html('<a href="http://bücher.test:8080/">u</a>'
                    '<a href="http://xn--bcher-kva.test:8080/">a</a>')
        assert links_of(body) == ("http://xn--bcher-kva.test:8080/",)

    def test_too_long_urls_are_rejected(self) -> None:
        long_path = "/" + "x" * 3000
        body = html(f'<a href="{long_path}"></a><a href="/short"></a>')
        got = extract(body, PAGE)
        assert got.links == ("http://e.com/short",)
        assert got.rejected == 1
        assert len(extract(body, PAGE, max_url_length=4000).links) == 2

    def test_rel_nofollow_anchors_are_skipped_unless_asked(self) -> None:
        body = html('<a href="/a" rel="nofollow">a</a><a href="/b" rel="Sponsored NoFollow">b</a>'
                    '<a href="/c" rel="noopener">c</a><area href="/d" rel="nofollow">')
        got = extract(body, PAGE)
        assert got.links == ("http://e.com/c",)
        assert got.rejected == 3
        assert extract(body, PAGE, follow_rel_nofollow=True).links == (
            "http://e.com/a", "http://e.com/b", "http://e.com/c", "http://e.com/d")

    def test_max_links_truncates(self) -> None:
        body = html("".join(f'<a href="/p{i}"></a>' for i in range(50)) +
                    '<meta name="robots" content="noindex">')
        got = extract(body, PAGE, max_links=10)
        assert got.links == tuple(f"http://e.com/p{i}" for i in range(10))
        assert got.truncated
        assert got.noindex  # metas after the cut still count
        assert not extract(body, PAGE).truncated

    def test_raw_href_cap_bounds_link_stuffed_pages(self) -> None:
        # repeated hrefs cost nothing; 400 distinct raw spellings (4 x max_links) are kept
        body = html('<a href="/same"></a>' * 5000 + '<a href="/late"></a>')
        assert extract(body, PAGE, max_links=1).links == ("http://e.com/same", )
        spellings = "".join(f'<a href="/same#{i}"></a>' for i in range(400))
        got = extract(html(spellings + '<a href="/late"></a>'), PAGE, max_links=100)
        assert got.links == ("http://e.com/same",)
        assert got.truncated

    def test_page_url_must_be_valid(self) -> None:
        with pytest.raises(URLError):
            extract(html('<a href="/x"></a>'), "mailto:x@e.com")
        with pytest.raises(URLError):
            extract(html('<a href="/x"></a>'), "not a url")

    def test_page_url_is_normalized_first(self) -> None:
        got = extract(html('<a href="x"></a>'), "HTTP://E.COM:80/a/./b/c#f")
        assert got.base == "http://e.com/a/b/c"
        assert got.links == ("http://e.com/a/b/x",)


class TestBase:
    def test_relative_base_resolved_against_the_page(self) -> None:
        body = html('<a href="a.html"></a><a href="b.html?q=1"></a><a href="/root.html"></a>'
                    '<a href="../up.html"></a>', head='<base href="/x/dir/">')
        got = extract(body, PAGE)
        assert got.base == "http://e.com/x/dir/"
        assert got.links == ("http://e.com/x/dir/a.html", "http://e.com/x/dir/b.html?q=1",
                             "http://e.com/root.html", "http://e.com/x/up.html")

    def test_absolute_base_and_only_the_first_counts(self) -> None:
        body = html('<a href="c.html"></a><base href="http://third.com/">',
                    head='<base target="_top"><base href="HTTP://Other.com/abs/">'
                         '<base href="http://second.com/">')
        got = extract(body, PAGE)
        assert got.base == "http://other.com/abs/"
        assert got.links == ("http://other.com/abs/c.html",)

    def test_base_after_the_links_still_applies(self) -> None:
        body = html('<a href="c.html"></a><base href="/late/">')
        assert links_of(body) == ("http://e.com/late/c.html",)

    def test_base_with_query_and_empty_href(self) -> None:
        body = html('<a href=""></a><a href="?y"></a>', head='<base href="/b/p?x">')
        assert links_of(body) == ("http://e.com/b/p?x", "http://e.com/b/p?y")

    def test_invalid_base_falls_back_to_the_page(self) -> None:
        body = html('<a href="c.html"></a>', head='<base href="http://[broken/">')
        got = extract(body, PAGE)
        assert got.base == PAGE
        assert got.links == ("http://e.com/dir/c.html",)

    def test_non_http_base_makes_relative_links_unusable(self) -> None:
        body = html('<a href="c.html"></a><a href="http://e.com/abs"></a>',
                    head='<base href="ftp://files.e.com/">')
        got = extract(body, PAGE)
        assert got.base == ""
        assert got.links == ("http://e.com/abs",)
        assert got.rejected == 1


class TestMetaRobots:
    @pytest.mark.parametrize(("meta", "nofollow", "noindex"), [
        ('<meta name="robots" content="nofollow">', True, False),
        ('<meta name="robots" content="noindex">', False, True),
        ('<meta name="ROBOTS" content="NONE">', True, True),
        ('<meta name="robots" content="noindex, NoFollow">', True, True),
        ('<meta name=" Robots " content=" index , follow ">', False, False),
        ('<meta name="badbot" content="nofollow">', False, False),
        ('<meta name="robots">', False, False),
        ('<meta content="nofollow">', False, False),
        ('<meta name="robots" content="noarchive"><meta name="robots" content="nofollow">',
         True, False),
    ])
    def test_meta(self, meta: str, nofollow: bool, noindex: bool) -> None:
        got = extract(html('<a href="/x"></a>', head=meta), PAGE)
        assert (got.nofollow, got.noindex) == (nofollow, noindex)
        assert got.links == ("http://e.com/x",)  # listed even when nofollow

    def test_own_product_token(self) -> None:
        body = html("", head='<meta name="KVCrawl" content="noindex">')
        assert not extract(body, PAGE).noindex
        assert extract(body, PAGE, robots_meta_names=("robots", "kvcrawl")).noindex

    @pytest.mark.parametrize(("value", "want"), [
        ("nofollow", (True, False)),
        ("noindex, nofollow", (True, True)),
        ("none", (True, True)),
        ("googlebot: nofollow", (False, False)),
        ("unavailable_after: 25 Jun 2010 15:00:00 PST, noindex", (False, True)),
        ("otherbot: noindex, nofollow", (False, False)),
        ("", (False, False)),
    ])
    def test_robots_directives(self, value: str, want: tuple[bool, bool]) -> None:
        assert robots_directives(value) == want

    def test_robots_directives_for_a_named_agent(self) -> None:
        assert robots_directives("KVCrawl: noindex", ["kvcrawl"]) == (False, True)


class TestRobustness:
    def test_malformed_html(self) -> None:
        body = (b"<html><head><title>broken</title><body>\n"
                b"<div><p>text <a href=\"/ok-1\">one</a> <table><tr><td>"
                b"<a href='/ok-2'>two</td></div></p>\n<a href=/ok-3>three <b><i>unclosed</b>\n"
                b"</table></table></span></html>\n<p <p>>> & &amp &#xZZ; < > \"'\n"
                b"<a href=\"/ok-4\">after the end</a>\n<!-- never ends <a href=\"/never\">\n")
        assert links_of(body) == tuple(f"http://e.com/ok-{i}" for i in range(1, 5))

    def test_100k_nested_divs_on_a_small_thread_stack(self) -> None:
        depth = 100_000
        body = (b'<html><body><a href="/before">b</a>' + b"<div>" * depth +
                b'<a href="/inside">i</a>' + b"</div>" * depth + b'<a href="/after">a</a>')
        got = in_small_thread(lambda: extract(body, PAGE))
        assert got.links == ("http://e.com/before", "http://e.com/inside", "http://e.com/after")

    def test_unclosed_inline_tags_deeper_than_libxml2s_tree_limit(self) -> None:
        body = b"<p>" + b"<font size=2><b>" * 1000 + b'<a href="/deep">x</a>' + b'<a href="/x">'
        got = in_small_thread(lambda: extract(body, PAGE))
        assert got.links == ("http://e.com/deep", "http://e.com/x")

    def test_ten_megabyte_page(self) -> None:
        unit = b'<p>filler text <b>bold</b> and a <a href="/l%d">link</a></p>\n'
        parts = [b'<html><body><a href="/first">f</a>']
        size, i = 0, 0
        while size < 10 * 1024 * 1024:
            chunk = unit % (i % 5000)
            parts.append(chunk)
            size += len(chunk)
            i += 1
        parts.append(b'<a href="/last">l</a></body></html>')
        body = b"".join(parts)
        got = in_small_thread(lambda: extract(body, PAGE))
        assert got.links[0] == "http://e.com/first"
        assert got.links[-1] == "http://e.com/last"
        assert len(got.links) == 5002 and not got.truncated

    def test_single_text_run_longer_than_libxml2s_limit(self) -> None:
        body = b'<a href="/first">f</a><p>' + b"x" * (11 * 1024 * 1024) + b'<a href="/last">l</a>'
        got = extract(body, PAGE)
        assert got.links == ("http://e.com/first", "http://e.com/last")

    def test_nul_bytes(self) -> None:
        body = b'\x00<a href="/a\x00b">x</a>\x00\x00<a href="/c">y</a>\x00'
        assert links_of(body) == ("http://e.com/a%EF%BF%BDb", "http://e.com/c")

    @pytest.mark.parametrize("body", [b"", b"   \n\t ", b"\x00", b"\xef\xbb\xbf", b"<", b"<!--",
                                      b"</a>", b"]]>", b"<?xml version='1.0'?>"])
    def test_empty_and_trivial_bodies(self, body: bytes) -> None:
        got = extract(body, PAGE, content_type="text/html")
        assert got.links == () and got.rejected == 0 and got.base == PAGE

    def test_bodies_that_are_not_html(self) -> None:
        rng = random.Random(5)
        png = b"\x89PNG\r\n\x1a\n" + rng.randbytes(4096)
        pdf = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\n" + rng.randbytes(2048)
        for body in (png, pdf, rng.randbytes(65536), b"{\"json\": [1, 2, 3]}",
                     b"plain text with a URL http://e.com/x in it"):
            got = extract(body, PAGE, content_type="text/html")
            assert got.links == ()

    def test_random_junk_with_tags_never_crashes(self) -> None:
        rng = random.Random(11)
        pieces = [b"<a href=", b"'", b'"', b">", b"<", b"</a>", b"<div>", b"<!--", b"-->",
                  b"<base href=", b"&", b"&#", b"\x00", b"\xff", b"/x", b"javascript:",
                  b"<script>", b"</script>", b"<meta charset=", b"koi8-r", b" "]
        for _ in range(300):
            body = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 80)))
            got = extract(body, PAGE)
            for link in got.links:
                assert normalize(link) == link

    def test_script_and_comment_contents_are_not_links(self) -> None:
        body = html('<script>document.write("<a href=\\"/s\\">")</script>'
                    '<!-- <a href="/c"> --><textarea><a href="/t"></textarea>'
                    '<noscript><a href="/ns">n</a></noscript><a href="/real">r</a>')
        assert links_of(body) == ("http://e.com/ns", "http://e.com/real")

    def test_xhtml(self) -> None:
        body = (b'<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/'
                b'xhtml"><head><base href="/b/"/></head><body><a href="x.html">x</a>'
                b'<a href="y.html"/></body></html>')
        got = extract(body, PAGE, content_type="application/xhtml+xml")
        assert got.links == ("http://e.com/b/x.html", "http://e.com/b/y.html")

    @pytest.mark.parametrize("body", [
        b'<html><body><a href="/1"></body></html>\n<a href="/2">appended</a>',
        b'<html><body><a href="/1"></body></html><html><body><a href="/2">',
        b'<!DOCTYPE html><html><body><a href="/1"></body></html></html></body><a href="/2">',
    ])
    def test_links_after_the_end_of_the_document(self, body: bytes) -> None:
        # browsers put such markup into the body; a libxml2 tree drops it
        assert links_of(body) == ("http://e.com/1", "http://e.com/2")


# -- against the test web ------------------------------------------------------------

def _oracle_links(web: TestWeb, url: str) -> list[str]:
    node = web.oracle.describe(url)
    assert node is not None
    return [x for x in dict.fromkeys(node.links) if x != url]


class TestTestWeb:
    def test_every_page_of_the_site_matches_the_graph(self, testweb: TestWeb) -> None:
        site = testweb.site
        for pid in range(testweb.graph.pages):
            url = site.page_url(pid)
            t = split(url)
            assert t is not None
            node = site.lookup(t.host, t.target)
            body = site.body(t.host, node)
            got = extract(body, url, content_type=node.content_type)
            # every link once, in the graph's order; the page's own #top/#main links aside
            assert [x for x in got.links if x != url] == _oracle_links(testweb, url), url
            assert got.rejected == 0 and not got.nofollow and got.charset == "utf-8"

    def test_pages_fetched_over_http(self, testweb: TestWeb) -> None:
        session = testweb.session()
        todo, seen = [testweb.seed_url], set()
        while todo and len(seen) < 15:
            url = todo.pop(0)
            if url in seen:
                continue
            seen.add(url)
            resp = session.get(url, timeout=10)
            assert resp.status_code == 200
            ctype = resp.headers.get("Content-Type")
            assert is_html(ctype, resp.content[:512])
            got = extract(resp.content, resp.url, content_type=ctype)
            assert [x for x in got.links if x != url] == _oracle_links(testweb, url)
            todo.extend(x for x in got.links if "/s" in x and x not in seen)
        assert len(seen) == 15

    def test_hostile_features(self, make_testweb: Callable[..., TestWeb]) -> None:
        kinds = ("charsets", "malformed", "base_href", "link_schemes", "idn", "meta_robots",
                 "binary", "long_urls", "wrong_type")
        web = make_testweb(pages=10, hosts=2, faults=[fault(k) for k in kinds])
        session = web.session()
        hub = web.url("h0.test", "/x/")
        todo, seen, found, parsed = [hub], set(), set(), 0
        while todo:
            url = todo.pop(0)
            if url in seen or not url.startswith(hub):
                continue
            seen.add(url)
            node = web.oracle.describe(url)
            resp = session.get(url, timeout=10, allow_redirects=False)
            assert node is not None and resp.status_code == node.status
            if resp.status_code != 200:
                continue
            ctype = resp.headers.get("Content-Type")
            assert is_html(ctype, resp.content[:512]) is node.html, url
            if not node.html:
                continue
            got = extract(resp.content, url, content_type=ctype, max_url_length=100_000)
            parsed += 1
            want = _oracle_links(web, url)
            have = [x for x in got.links if x != url]
            if url.endswith("/malformed/deep"):
                # the oracle leaves the link inside 20,000 divs open; we find it
                assert have == want + [web.url("h0.test", "/x/malformed/ok-1")]
            else:
                assert sorted(have) == sorted(want), url
            header = resp.headers.get("X-Robots-Tag", "")
            assert (got.nofollow or robots_directives(header)[0]) is node.nofollow, url
            assert got.noindex is node.noindex, url
            todo.extend(got.links)
            found.update(got.links)
        assert parsed >= 30
        assert web.url("h0.test", "/x/wrong_type/hidden") not in found
        assert web.url("xn--bcher-kva.test") in found
        assert web.url("h0.test", "/x/charsets/caf%C3%A9") in found

    def test_link_schemes_page_in_detail(self, make_testweb: Callable[..., TestWeb]) -> None:
        web = make_testweb(pages=4, hosts=1, faults=[fault("link_schemes")])
        url = web.url("h0.test", "/x/link_schemes/page")
        resp = web.session().get(url, timeout=10)
        got = extract(resp.content, url, content_type=resp.headers["Content-Type"])
        assert set(got.links) == set(web.oracle.describe(url).links)  # includes the page
        assert got.rejected == 5  # javascript, mailto, data, tel, ftp

    def test_long_urls_by_limit(self, make_testweb: Callable[..., TestWeb]) -> None:
        web = make_testweb(pages=4, hosts=1, faults=[fault("long_urls")])
        url = web.url("h0.test", "/x/long_urls/page")
        body = web.session().get(url, timeout=10).content
        assert len(extract(body, url).links) == 1  # 2,000 fits under 2,083
        assert extract(body, url).rejected == 2
        full = extract(body, url, max_url_length=100_000)
        assert list(full.links) == _oracle_links(web, url)

    def test_concurrent_extraction_in_small_threads(self, testweb: TestWeb) -> None:
        site = testweb.site
        pages = []
        for pid in range(testweb.graph.pages):
            url = site.page_url(pid)
            t = split(url)
            assert t is not None
            pages.append((site.body(t.host, site.lookup(t.host, t.target)), url))
        want = [extract(b, u) for b, u in pages]
        results: list[list[PageLinks]] = []
        lock = threading.Lock()

        def work() -> None:
            got = [extract(b, u) for b, u in pages]
            with lock:
                results.append(got)

        old = threading.stack_size(SMALL_STACK)
        try:
            threads = [threading.Thread(target=work) for _ in range(6)]
            for t in threads:
                t.start()
        finally:
            threading.stack_size(old)
        for t in threads:
            t.join()
        assert results == [want] * 6


class TestTreeFastPath:
    """extract() parses small pages into a tree (fast, GIL released) and falls back to the
    streaming target parser whenever a tree could lose links: both must agree."""

    def test_both_scanners_agree_on_every_hostile_and_mangled_page(
        self, make_testweb: Callable[..., TestWeb]
    ) -> None:
        kinds = ("charsets", "malformed", "base_href", "link_schemes", "idn", "meta_robots",
                 "long_urls", "spider_trap")
        web = make_testweb(pages=30, hosts=2, faults=[fault(k) for k in kinds])
        site = web.site
        bodies = []
        for pid in range(web.graph.pages):
            t = split(site.page_url(pid))
            assert t is not None
            bodies.append(site.body(t.host, site.lookup(t.host, t.target)))
        for kind in kinds:
            for path in ("page", "deep", "ok-1", "a", "b"):
                node = site.lookup("h0.test", f"/x/{kind}/{path}")
                if node.status == 200 and node.html:
                    bodies.append(site.body("h0.test", node))
        rng = random.Random(5)
        mangled = []
        for body in bodies[:40]:
            cut = rng.randrange(len(body))
            mangled.append(body[:cut])  # a torn page
            mangled.append(body + b'</html><p><a href="/after-end">x</a>')
            mangled.append(body.replace(b"</", b"<", rng.randrange(1, 50)))  # unclosed tags
        tree_used = 0
        for data in bodies + mangled:
            slow = links_mod._scan_target(data, 400)
            assert links_mod._scan(data, 400) == slow
            tree_used += links_mod._scan_tree(data, 400) is not None
        assert tree_used > len(bodies) // 2  # the fast path is the common case

    def test_links_after_the_end_tag_and_past_the_depth_limit_are_kept(self) -> None:
        after = b'<html><body><a href="/in">i</a></body></html><a href="/after">a</a>'
        assert extract(after, "http://e.com/").links == ("http://e.com/in", "http://e.com/after")
        deep = b"<div>" * 300 + b'<a href="/deep">d</a>'
        assert extract(deep, "http://e.com/").links == ("http://e.com/deep",)
