"""crawler.web.urls: normalization table (RFC 3986 section 5.4 / 6.2 and WHATWG-style cases of
our own), rejections by reason, keys and origin helpers, and hypothesis properties."""

from __future__ import annotations

import hashlib
import string
import threading
from urllib.parse import urlsplit, urlunsplit

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from crawler.exceptions import CrawlerError, URLError
from crawler.net.fetch import _request_of
from crawler.web._robotstxt import canon, target
from crawler.web.robots import robots_key, robots_url
from crawler.web.urls import (
    DEFAULT_MAX_URL_LENGTH,
    URL,
    host_key,
    host_of,
    host_of_netloc,
    netloc_of,
    normalize,
    origin,
    parse,
    url_key,
)

RFC_BASE = "http://a/b/c/d;p?q"

# RFC 3986 section 5.4: reference resolution examples (normal and abnormal).
# "g:h" is omitted (it has a scheme we reject); "http:g" follows the non-strict
# (WHATWG) reading that RFC 5.2.2 allows.
RFC_5_4 = [
    ("g", "http://a/b/c/g"),
    ("./g", "http://a/b/c/g"),
    ("g/", "http://a/b/c/g/"),
    ("/g", "http://a/g"),
    ("//g", "http://g/"),
    ("?y", "http://a/b/c/d;p?y"),
    ("g?y", "http://a/b/c/g?y"),
    ("#s", "http://a/b/c/d;p?q"),
    ("g#s", "http://a/b/c/g"),
    ("g?y#s", "http://a/b/c/g?y"),
    (";x", "http://a/b/c/;x"),
    ("g;x", "http://a/b/c/g;x"),
    ("g;x?y#s", "http://a/b/c/g;x?y"),
    ("", "http://a/b/c/d;p?q"),
    (".", "http://a/b/c/"),
    ("./", "http://a/b/c/"),
    ("..", "http://a/b/"),
    ("../", "http://a/b/"),
    ("../g", "http://a/b/g"),
    ("../..", "http://a/"),
    ("../../", "http://a/"),
    ("../../g", "http://a/g"),
    ("../../../g", "http://a/g"),
    ("../../../../g", "http://a/g"),
    ("/./g", "http://a/g"),
    ("/../g", "http://a/g"),
    ("g.", "http://a/b/c/g."),
    (".g", "http://a/b/c/.g"),
    ("g..", "http://a/b/c/g.."),
    ("..g", "http://a/b/c/..g"),
    ("./../g", "http://a/b/g"),
    ("./g/.", "http://a/b/c/g/"),
    ("g/./h", "http://a/b/c/g/h"),
    ("g/../h", "http://a/b/c/h"),
    ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
    ("g;x=1/../y", "http://a/b/c/y"),
    ("g?y/./x", "http://a/b/c/g?y/./x"),
    ("g?y/../x", "http://a/b/c/g?y/../x"),
    ("g#s/./x", "http://a/b/c/g"),
    ("g#s/../x", "http://a/b/c/g"),
    ("http:g", "http://a/b/c/g"),
]

# (input, base or None, expected): our own cases from RFC 3986 6.2 and WHATWG.
CASES = [
    # case and default ports (6.2.2.1, 6.2.3)
    ("HTTP://Example.COM/Path", None, "http://example.com/Path"),
    ("hTTpS://EXAMPLE.com:443/", None, "https://example.com/"),
    ("http://example.com:80/a", None, "http://example.com/a"),
    ("https://example.com:80/a", None, "https://example.com:80/a"),
    ("http://example.com:443/a", None, "http://example.com:443/a"),
    ("http://example.com:/a", None, "http://example.com/a"),
    ("http://example.com:0080/a", None, "http://example.com/a"),
    ("http://example.com:8080", None, "http://example.com:8080/"),
    # empty path -> "/"
    ("http://example.com", None, "http://example.com/"),
    ("http://example.com?q=1", None, "http://example.com/?q=1"),
    ("http://example.com#frag", None, "http://example.com/"),
    # percent-encoding (6.2.2.2): decode unreserved, uppercase the rest, encode the rest
    ("http://e.com/%7Euser/%7e/%41%2d%2E%5f", None, "http://e.com/~user/~/A-._"),
    ("http://e.com/a%2fb%2Fc", None, "http://e.com/a%2Fb%2Fc"),
    ("http://e.com/%c3%a9?x=%c3%a9", None, "http://e.com/%C3%A9?x=%C3%A9"),
    ("http://e.com/a b?c d", None, "http://e.com/a%20b?c%20d"),
    ("http://e.com/café?q=naïve", None, "http://e.com/caf%C3%A9?q=na%C3%AFve"),
    ("http://e.com/日本", None, "http://e.com/%E6%97%A5%E6%9C%AC"),
    ("http://e.com/100%/%zz/%4", None, "http://e.com/100%25/%25zz/%254"),
    ('http://e.com/"<>`{}|^', None, "http://e.com/%22%3C%3E%60%7B%7D%7C%5E"),
    ("http://e.com/[x]", None, "http://e.com/%5Bx%5D"),
    ("http://e.com/a;b=c,d!$&'()*+:@x", None, "http://e.com/a;b=c,d!$&'()*+:@x"),
    ("http://e.com/p?a=1&b=2&a=0", None, "http://e.com/p?a=1&b=2&a=0"),
    ("http://e.com/p?b=2&a=1", None, "http://e.com/p?b=2&a=1"),
    ("http://e.com/p?x=a+b%20c", None, "http://e.com/p?x=a+b%20c"),
    ("http://e.com/p?/path?q", None, "http://e.com/p?/path?q"),
    ("http://e.com/p?", None, "http://e.com/p"),
    ("http://e.com/p\x01q", None, "http://e.com/p%01q"),
    # dot segments, including encoded dots (WHATWG) and queries left alone
    ("http://e.com/a/./b/../c", None, "http://e.com/a/c"),
    ("http://e.com/a/%2e/b/%2E%2e/c", None, "http://e.com/a/c"),
    ("http://e.com/../../x", None, "http://e.com/x"),
    ("http://e.com/a/..", None, "http://e.com/"),
    ("http://e.com/a//b/../c", None, "http://e.com/a//c"),
    ("http://e.com/p?x=/../y", None, "http://e.com/p?x=/../y"),
    # fragments
    ("http://e.com/p#a#b", None, "http://e.com/p"),
    ("http://e.com/p?q#f?g", None, "http://e.com/p?q"),
    ("#only", "http://e.com/p?q=1#old", "http://e.com/p?q=1"),
    # relative references against an ordinary page
    ("../x.html", "http://e.com/s1/p2.html", "http://e.com/x.html"),
    ("p7.html", "http://e.com/s1/p2.html", "http://e.com/s1/p7.html"),
    ("//other.com", "https://e.com/a", "https://other.com/"),
    ("//Other.COM:8443/x", "http://e.com/a", "http://other.com:8443/x"),
    ("?page=2", "http://e.com/list?page=1", "http://e.com/list?page=2"),
    ("HTTP://E.COM/Upper", "http://e.com/a", "http://e.com/Upper"),
    ("https:x", "http://e.com/a/b", "https://x/"),
    ("http:/x/y", "http://e.com/a/b", "http://e.com/x/y"),
    ("a:b", "http://e.com/", None),  # a scheme "a": rejected, see REJECTS
    # whitespace and the characters WHATWG removes
    ("  http://e.com/x  ", None, "http://e.com/x"),
    ("\t\nhttp://e.com/x\r\n", None, "http://e.com/x"),
    ("http://e.c\tom/a\nb\rc", None, "http://e.com/abc"),
    ("\x00\x1f http://e.com/ \x0b", None, "http://e.com/"),
    ("http://e.com/a\u00a0b", None, "http://e.com/a%C2%A0b"),
    (" rel.html ", "http://e.com/d/", "http://e.com/d/rel.html"),
    # backslashes (WHATWG special schemes) before the query only
    ("http:\\\\e.com\\a\\b?c\\d", None, "http://e.com/a/b?c%5Cd"),
    ("\\\\other.com\\x", "http://e.com/", "http://other.com/x"),
    ("..\\y", "http://e.com/a/b/c", "http://e.com/a/y"),
    # extra slashes after the scheme
    ("http:///e.com/x", None, "http://e.com/x"),
    ("http:e.com/x", None, "http://e.com/x"),
    ("///e.com/x", "http://base.com/", "http://e.com/x"),
    # userinfo is stripped
    ("http://user:pw@e.com/x", None, "http://e.com/x"),
    ("http://@e.com/x", None, "http://e.com/x"),
    ("http://a@b@e.com/x", None, "http://e.com/x"),
    ("http://www.good.com@evil.com/", None, "http://evil.com/"),
    # hosts: IDN, trailing dot, percent-encoded, underscores
    ("http://Bücher.TEST:8080/", None, "http://xn--bcher-kva.test:8080/"),
    ("http://xn--BCHER-kva.test/", None, "http://xn--bcher-kva.test/"),
    ("http://faß.de/", None, "http://xn--fa-hia.de/"),
    ("http://ＥＸＡＭＰＬＥ。com/", None, "http://example.com/"),
    ("http://例え.テスト/パス", None, "http://xn--r8jz45g.xn--zckzah/%E3%83%91%E3%82%B9"),
    ("http://e.com./x", None, "http://e.com/x"),
    ("http://%65.com/", None, "http://e.com/"),
    ("http://%C3%BC.de/", None, "http://xn--tda.de/"),
    ("http://_dmarc.e.com/", None, "http://_dmarc.e.com/"),
    # UTS #46 allows it, IDNA 2008 does not: Punycode anyway, as browsers do
    ("http://☃.net/", None, "http://xn--n3h.net/"),
    # IPv4, including the WHATWG numeric forms
    ("http://127.0.0.1:8080/", None, "http://127.0.0.1:8080/"),
    ("http://0x7f.1/", None, "http://127.0.0.1/"),
    ("http://2130706433/", None, "http://127.0.0.1/"),
    ("http://0177.0.0.1/", None, "http://127.0.0.1/"),
    ("http://192.168.1/", None, "http://192.168.0.1/"),
    ("http://0xg.com/", None, "http://0xg.com/"),
    # IPv6 literals are kept, compressed and lowercase
    ("http://[::1]:8080/x", None, "http://[::1]:8080/x"),
    ("http://[2001:DB8:0:0:0:0:0:1]/", None, "http://[2001:db8::1]/"),
    ("https://[::FFFF:1.2.3.4]:443/", None, "https://[::ffff:102:304]/"),
]

REJECTS = [
    ("javascript:void(0)", "scheme"),
    ("JavaScript:alert(1)", "scheme"),
    ("mailto:someone@e.com", "scheme"),
    ("data:text/html,<a href=/x>x</a>", "scheme"),
    ("tel:+15550100", "scheme"),
    ("ftp://e.com/file", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("a:b", "scheme"),
    ("relative/path", "relative"),
    ("//host-only", "relative"),
    ("", "relative"),
    ("http://", "host"),
    ("http:///", "host"),
    ("http://:80/", "host"),
    ("http://a..b/", "host"),
    ("http://a b/", "host"),
    ("http://a<b/", "host"),
    ("http://e.com../", "host"),
    ("http://" + "a" * 64 + ".com/", "host"),
    ("http://" + ".".join(["abcdefghi"] * 26) + "/", "host"),
    ("http://1.2.3.4.5/", "host"),
    ("http://256.1.1.1/", "host"),
    ("http://1.2.3.09/", "host"),
    ("http://e.123/", "host"),
    ("http://%FF.com/", "host"),
    ("http://a\u200db.net/", "host"),  # a joiner where IDNA forbids it
    ("http://[::1/", "host"),
    ("http://[fe80::1%25eth0]/", "host"),
    ("http://[v1.x]/", "host"),
    ("http://[::1]x/", "host"),
    ("http://e.com:0/", "port"),
    ("http://e.com:65536/", "port"),
    ("http://e.com:8a/", "port"),
    ("http://e.com:-1/", "port"),
    ("http://e.com:80:90/", "port"),
    ("http://e.com:８０/", "port"),
]


class TestNormalizeTable:
    @pytest.mark.parametrize(("ref", "want"), RFC_5_4, ids=[r or "<empty>" for r, _ in RFC_5_4])
    def test_rfc3986_5_4_resolution(self, ref: str, want: str) -> None:
        assert normalize(ref, RFC_BASE) == want

    @pytest.mark.parametrize(("url", "base", "want"), [c for c in CASES if c[2] is not None],
                             ids=[repr(c[0])[:40] for c in CASES if c[2] is not None])
    def test_case(self, url: str, base: str | None, want: str) -> None:
        got = normalize(url, base)
        assert got == want
        assert normalize(got) == got

    def test_table_is_large_enough(self) -> None:
        assert len(RFC_5_4) + len(CASES) + len(REJECTS) >= 60

    @pytest.mark.parametrize(("url", "reason"), REJECTS, ids=[repr(r[0])[:40] for r in REJECTS])
    def test_rejected_with_reason(self, url: str, reason: str) -> None:
        with pytest.raises(URLError) as info:
            normalize(url)
        assert info.value.reason == reason
        assert info.value.url == url

    def test_rejected_schemes_with_a_base(self) -> None:
        for url in ("javascript:x()", "mailto:a@b", "data:,x", "tel:1", "ftp://e.com/"):
            with pytest.raises(URLError, match="scheme"):
                normalize(url, "http://e.com/")

    def test_urlerror_is_a_valueerror_and_crawlererror(self) -> None:
        with pytest.raises(ValueError):
            normalize("mailto:x@y")
        with pytest.raises(CrawlerError):
            normalize("mailto:x@y")

    def test_bad_base_names_the_base(self) -> None:
        with pytest.raises(URLError) as info:
            normalize("x.html", "ftp://e.com/")
        assert info.value.url == "ftp://e.com/"
        assert info.value.reason == "base scheme"


class TestLength:
    def test_default_limit_allows_exactly_max(self) -> None:
        head = "http://e.com/"
        url = head + "x" * (DEFAULT_MAX_URL_LENGTH - len(head))
        assert normalize(url) == url
        with pytest.raises(URLError) as info:
            normalize(url + "y")
        assert info.value.reason == "too_long"

    def test_limit_applies_to_the_normalized_form(self) -> None:
        # 10 raw characters of non-ASCII become 90 after encoding
        url = "http://e.com/" + "é" * 10
        assert len(normalize(url, max_length=13 + 60)) == 13 + 60
        with pytest.raises(URLError, match="too_long"):
            normalize("http://e.com/" + "日" * 10, max_length=13 + 89)
        # dot segments can make it shorter than the input
        assert normalize("http://e.com/aaaaaaaaaa/../b", max_length=16) == "http://e.com/b"

    def test_very_long_input_is_refused_cheaply(self) -> None:
        with pytest.raises(URLError, match="too_long"):
            normalize("http://e.com/" + "a/.." * 1_000_000)

    def test_custom_limit(self) -> None:
        url = "http://e.com/" + "x" * 70_000
        assert normalize(url, max_length=100_000) == url


class TestKeysAndOrigin:
    def test_url_key_is_md5_of_utf8(self) -> None:
        url = normalize("HTTP://E.com:80/a b")
        assert url_key(url) == hashlib.md5(url.encode()).digest()
        assert len(url_key(url)) == 16

    def test_equivalent_spellings_share_a_key(self) -> None:
        spellings = [
            "http://e.com/~a/b c",
            "HTTP://E.COM:80/%7ea/b%20c#frag",
            "http://e.com/x/../%7Ea/./b c",
            "http://user@e.com./~a/b%20c",
        ]
        assert len({url_key(normalize(s)) for s in spellings}) == 1

    def test_host_key_ignores_port_and_case(self) -> None:
        assert host_key("E.com") == host_key("e.com") == hashlib.md5(b"e.com").digest()
        a = host_of(normalize("http://e.com:8080/"))
        b = host_of(normalize("https://E.COM/"))
        assert host_key(a) == host_key(b)

    @pytest.mark.parametrize(("url", "want"), [
        ("http://e.com/x", ("http", "e.com", 80)),
        ("https://e.com/x", ("https", "e.com", 443)),
        ("http://e.com:8080/x?y", ("http", "e.com", 8080)),
        ("https://[::1]/", ("https", "[::1]", 443)),
        ("http://[2001:db8::1]:81/", ("http", "[2001:db8::1]", 81)),
        ("http://127.0.0.1:9/", ("http", "127.0.0.1", 9)),
    ])
    def test_origin_and_host_of(self, url: str, want: tuple[str, str, int]) -> None:
        assert origin(url) == want
        assert host_of(url) == want[1]

    def test_origin_of_a_relative_url_raises(self) -> None:
        with pytest.raises(URLError):
            origin("/just/a/path")
        with pytest.raises(URLError):
            host_of("e.com/x")


@pytest.mark.parametrize("url", ["http://e.com/x", "https://E.com:8080/", "http://[::1]:81/a",
                                 "http://[2001:db8::1]/", "http://127.0.0.1:9/"])
def test_one_split_of_the_authority_everywhere(url: str) -> None:
    """Router, parse, origin and host_of cut the same host out of a URL."""
    u = parse(url)
    assert netloc_of(url) == u.netloc or netloc_of(url).endswith(f":{u.port}")
    assert host_of_netloc(netloc_of(url)) == host_of(url) == u.host == origin(url)[1]


class TestParse:
    """parse(): a normalized URL split once; its parts are what every step used to re-split."""

    @pytest.mark.parametrize(("url", "want", "netloc"), [
        ("http://e.com/x", ("http", "e.com", 80, "/x"), "e.com"),
        ("https://e.com/", ("https", "e.com", 443, "/"), "e.com"),
        ("http://e.com:8080/x?y=1&z", ("http", "e.com", 8080, "/x?y=1&z"), "e.com:8080"),
        ("https://[::1]/", ("https", "[::1]", 443, "/"), "[::1]"),
        ("http://[2001:db8::1]:81/a", ("http", "[2001:db8::1]", 81, "/a"), "[2001:db8::1]:81"),
        ("http://127.0.0.1:9/", ("http", "127.0.0.1", 9, "/"), "127.0.0.1:9"),
    ])
    def test_parts(self, url: str, want: tuple[str, str, int, str], netloc: str) -> None:
        u = parse(url)
        assert u == URL(url, *want, host_key(want[1]))
        assert u.origin == origin(url) == want[:3]
        assert u.netloc == netloc
        assert u.host_key == host_key(want[1])
        assert u.robots_key == f"{want[0]}://{want[1]}:{want[2]}"
        assert u.robots_url == f"{want[0]}://{netloc}/robots.txt"

    def test_a_string_without_a_scheme_raises(self) -> None:
        for bad in ("/just/a/path", "e.com/x", "://e.com/"):
            with pytest.raises(URLError) as info:
                parse(bad)
            assert info.value.reason == "relative"

    def test_a_port_that_is_no_number_raises_urlerror(self) -> None:
        with pytest.raises(URLError) as info:
            parse("http://e.com:x/")
        assert info.value.reason == "port"

    def test_is_immutable(self) -> None:
        u = parse("http://e.com/")
        with pytest.raises(AttributeError):
            u.host = "f.com"  # type: ignore[misc]


class TestThreads:
    def test_many_threads_small_stacks_agree(self) -> None:
        urls = [f"HTTP://H{i % 7}.Test:80/a/../p{i}.html?x={i}#f" for i in range(2000)]
        want = [normalize(u) for u in urls]
        results: list[list[str]] = []
        lock = threading.Lock()

        def work() -> None:
            got = [normalize(u) for u in urls]
            with lock:
                results.append(got)

        old = threading.stack_size(256 * 1024)
        try:
            threads = [threading.Thread(target=work) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            threading.stack_size(old)
        assert results == [want] * 8


# -- properties --------------------------------------------------------------------

_label = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=12)
_uni_label = st.text(st.characters(min_codepoint=0xC0, max_codepoint=0x24F), min_size=1,
                     max_size=6)
_host = st.one_of(
    st.lists(_label, min_size=1, max_size=4).map(".".join),
    st.lists(st.one_of(_label, _uni_label), min_size=1, max_size=3).map(".".join),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
_chunk = st.text(
    st.one_of(st.sampled_from(list("/.%?#&=;+ \\@:~!$'()*,[]\"<>{}|^`\t")),
              st.characters(blacklist_categories=("Cs",))),
    max_size=30,
)
_absolute = st.builds(
    lambda scheme, host, port, path, rest: f"{scheme}://{host}{port}/{path}{rest}",
    st.sampled_from(["http", "https", "HTTP", "Https"]),
    _host,
    st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")),
    _chunk,
    _chunk,
)
_any = st.one_of(_absolute, _chunk, st.text(max_size=40))


def _try(url: str, base: str | None = None) -> str | None:
    try:
        return normalize(url, base)
    except URLError:
        return None


class TestProperties:
    @settings(max_examples=300, deadline=None)
    @given(_absolute)
    def test_idempotent(self, url: str) -> None:
        once = _try(url)
        assume(once is not None)
        assert normalize(once) == once

    @settings(max_examples=300, deadline=None)
    @given(_any, _absolute)
    def test_relative_resolution_is_idempotent(self, ref: str, base: str) -> None:
        nbase = _try(base)
        assume(nbase is not None)
        out = _try(ref, nbase)
        if out is not None:
            assert normalize(out) == out
            assert normalize(out, nbase) == out  # an absolute URL ignores the base
            assert _try(ref, base) == out  # the raw base gives the same answer

    @settings(max_examples=300, deadline=None)
    @given(_any, _absolute)
    def test_output_parses_with_urllib(self, ref: str, base: str) -> None:
        nbase = _try(base)
        assume(nbase is not None)
        out = _try(ref, nbase)
        assume(out is not None)
        assert out.isascii() and out.isprintable() and " " not in out
        parts = urlsplit(out)
        assert parts.scheme in ("http", "https")
        assert parts.hostname
        assert parts.fragment == "" and "#" not in out
        assert parts.path.startswith("/")
        port = parts.port  # raises ValueError on a bad port
        assert port is None or 0 < port <= 65535
        assert urlunsplit(parts) == out
        assert len(out) <= DEFAULT_MAX_URL_LENGTH
        scheme, host, port2 = origin(out)
        assert (scheme, port2) == (parts.scheme, parts.port or {"http": 80, "https": 443}[scheme])
        assert host.strip("[]") == parts.hostname

    @settings(max_examples=200, deadline=None)
    @given(_absolute)
    def test_url_key_stable(self, url: str) -> None:
        out = _try(url)
        assume(out is not None)
        assert url_key(out) == url_key(normalize(out)) == hashlib.md5(out.encode()).digest()

    @settings(max_examples=200, deadline=None)
    @given(st.lists(_label, min_size=1, max_size=3).map(".".join),
           st.text(string.ascii_letters + string.digits + "-._~", max_size=20))
    def test_case_port_and_escapes_do_not_change_the_key(self, host: str, path: str) -> None:
        plain = _try(f"http://{host}/{path}")
        assume(plain is not None)
        escaped = "".join(f"%{ord(c):02x}" for c in path)
        variant = f"HTTP://{host.upper()}:80/{escaped}#x"
        assert url_key(normalize(variant)) == url_key(plain)

    @settings(max_examples=300, deadline=None)
    @given(_any, _absolute)
    def test_parse_gives_what_each_step_used_to_split(self, ref: str, base: str) -> None:
        """One split serves them all: the scheduler's host, the robots cache's key and
        rules target, the robots.txt URL, and the fetcher's request line and Host header."""
        nbase = _try(base)
        assume(nbase is not None)
        out = _try(ref, nbase)
        assume(out is not None)
        u = parse(out)
        assert u.url == out
        assert u.origin == origin(out)
        assert u.host == host_of(out)
        assert u.robots_key == robots_key(out)
        assert u.robots_url == robots_url(out)
        assert canon(u.target) == target(out)
        sent = _request_of(out)  # what Fetcher.fetch(str) sends
        assert u == sent
        assert u.netloc == sent.netloc == urlsplit(out).netloc
