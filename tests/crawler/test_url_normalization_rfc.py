"""crawler.web.urls against a table written from RFC 3986 and the WHATWG URL Standard.

Our own cases (not a copied suite): section 5.2/5.4 reference resolution with
the normal and abnormal examples' ideas against our own base, section 6.2.2
syntax-based and 6.2.3 scheme-based normalization, and the things a browser
does that the RFC does not. Each row is (input, base, expected), where
expected is the normalized URL or ``Reject(reason)``: a
:class:`~crawler.exceptions.URLError` with that reason. The rule numbers in
the comments are those of the rules list in crawler/web/urls.py's docstring.
Then hypothesis properties: idempotence, equivalent spellings share one key,
and the fast path agrees with the general one.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.exceptions import URLError
from crawler.web.urls import DEFAULT_MAX_URL_LENGTH, _normalize, normalize, url_key


@dataclass(frozen=True)
class Reject:
    reason: str


Want = str | Reject
Row = tuple[str, str | None, Want]

# Our base for the resolution cases: a path three segments deep with a
# parameter, and a query, so every step of RFC 3986 5.2.2 shows.
BASE = "http://www.example.test/one/two/three;v?k=v"
B_DIR = "http://www.example.test/one/two/"

# RFC 3986 5.4.1 ideas: ordinary relative references.
RESOLUTION_NORMAL: list[Row] = [
    ("leaf", BASE, B_DIR + "leaf"),
    ("./leaf", BASE, B_DIR + "leaf"),
    ("leaf/", BASE, B_DIR + "leaf/"),
    ("/top", BASE, "http://www.example.test/top"),
    ("//other.test", BASE, "http://other.test/"),
    ("//other.test/p?q", BASE, "http://other.test/p?q"),
    ("?only=query", BASE, "http://www.example.test/one/two/three;v?only=query"),
    ("leaf?q=1", BASE, B_DIR + "leaf?q=1"),
    ("#frag", BASE, BASE),
    ("leaf#frag", BASE, B_DIR + "leaf"),
    ("leaf?q#frag", BASE, B_DIR + "leaf?q"),
    (";p", BASE, B_DIR + ";p"),
    ("leaf;p", BASE, B_DIR + "leaf;p"),
    ("leaf;p?q#f", BASE, B_DIR + "leaf;p?q"),
    ("", BASE, BASE),
    (".", BASE, B_DIR),
    ("./", BASE, B_DIR),
    ("..", BASE, "http://www.example.test/one/"),
    ("../", BASE, "http://www.example.test/one/"),
    ("../up", BASE, "http://www.example.test/one/up"),
    ("../..", BASE, "http://www.example.test/"),
    ("../../up2", BASE, "http://www.example.test/up2"),
]

# RFC 3986 5.4.2 ideas: the abnormal cases.
RESOLUTION_ABNORMAL: list[Row] = [
    ("../../../above", BASE, "http://www.example.test/above"),
    ("../../../../../above", BASE, "http://www.example.test/above"),
    ("/./dot", BASE, "http://www.example.test/dot"),
    ("/../dotdot", BASE, "http://www.example.test/dotdot"),
    ("name.", BASE, B_DIR + "name."),
    (".name", BASE, B_DIR + ".name"),
    ("name..", BASE, B_DIR + "name.."),
    ("..name", BASE, B_DIR + "..name"),
    ("./../sib", BASE, "http://www.example.test/one/sib"),
    ("./d/.", BASE, B_DIR + "d/"),
    ("d/./e", BASE, B_DIR + "d/e"),
    ("d/../e", BASE, B_DIR + "e"),
    ("d;x=1/./e", BASE, B_DIR + "d;x=1/e"),
    ("d;x=1/../e", BASE, B_DIR + "e"),
    ("d?e/./f", BASE, B_DIR + "d?e/./f"),  # dot segments in a query are data
    ("d?e/../f", BASE, B_DIR + "d?e/../f"),
    ("d#e/../f", BASE, B_DIR + "d"),
    ("http:leaf", BASE, B_DIR + "leaf"),  # rule 2: the non-strict reading, as WHATWG
    ("HTTP:leaf", BASE, B_DIR + "leaf"),
    ("https:leaf", BASE, "https://leaf/"),  # another scheme: an authority, as WHATWG
]

# RFC 3986 6.2.2 and 6.2.3, one rule at a time, on absolute URLs.
SYNTAX_AND_SCHEME: list[Row] = [
    # 6.2.2.1 case: scheme and host fold, the path does not
    ("HtTp://WWW.Example.TEST/Path/File", None, "http://www.example.test/Path/File"),
    ("HTTPS://EXAMPLE.TEST/", None, "https://example.test/"),
    ("http://example.test/a%2fb%3a", None, "http://example.test/a%2Fb%3A"),
    # 6.2.2.2 percent-encoding: unreserved decoded, the rest kept with uppercase hex
    ("http://example.test/%61%62%63%2D%2e%5F%7e", None, "http://example.test/abc-._~"),
    ("http://example.test/%41%5A%30%39", None, "http://example.test/AZ09"),
    ("http://example.test/a%2Fb", None, "http://example.test/a%2Fb"),  # reserved: kept
    ("http://example.test/?a=%26&b=%3d", None, "http://example.test/?a=%26&b=%3D"),
    ("http://example.test/%e2%82%ac", None, "http://example.test/%E2%82%AC"),
    ("http://example.test/50%", None, "http://example.test/50%25"),
    ("http://example.test/%g1/%1", None, "http://example.test/%25g1/%251"),
    # 6.2.2.3 dot segments, in absolute URLs too, and encoded dots (WHATWG)
    ("http://example.test/a/b/./../c", None, "http://example.test/a/c"),
    ("http://example.test/a/%2E%2e/b", None, "http://example.test/b"),
    ("http://example.test/a/.%2E/b/%2e", None, "http://example.test/b/"),
    ("http://example.test/..", None, "http://example.test/"),
    ("http://example.test/a/b/..", None, "http://example.test/a/"),
    ("http://example.test/.well-known/x", None, "http://example.test/.well-known/x"),
    # 6.2.3 scheme-based: default port, empty port, empty path
    ("http://example.test:80/", None, "http://example.test/"),
    ("https://example.test:443/x", None, "https://example.test/x"),
    ("http://example.test:443/", None, "http://example.test:443/"),
    ("https://example.test:80/", None, "https://example.test:80/"),
    ("http://example.test:/x", None, "http://example.test/x"),
    ("http://example.test:00081/x", None, "http://example.test:81/x"),
    ("http://example.test", None, "http://example.test/"),
    ("https://example.test?q", None, "https://example.test/?q"),
    ("http://example.test/p?", None, "http://example.test/p"),  # rule 4: empty query
]

# What a browser does (WHATWG URL Standard) and the choices of urls.py's rules.
BROWSER: list[Row] = [
    # backslashes count as slashes for http(s), up to the query
    ("http:\\\\example.test\\a\\b", None, "http://example.test/a/b"),
    ("\\\\other.test\\x", BASE, "http://other.test/x"),
    ("sub\\leaf", BASE, B_DIR + "sub/leaf"),
    ("..\\..\\up", BASE, "http://www.example.test/up"),
    ("/p?a\\b", BASE, "http://www.example.test/p?a%5Cb"),  # not in the query
    # extra or missing slashes after an http(s) scheme
    ("http:///example.test/x", None, "http://example.test/x"),
    ("https:////example.test", None, "https://example.test/"),
    ("https:/example.test/x", None, "https://example.test/x"),
    ("http:example.test", None, "http://example.test/"),
    ("///other.test/x", BASE, "http://other.test/x"),
    # tab, CR, LF removed anywhere; C0 controls and space trimmed at both ends
    ("http://exa\tmple.test/pa\nth", None, "http://example.test/path"),
    ("le\raf", BASE, B_DIR + "leaf"),
    ("\x01\x1f  http://example.test/x \x00\x0c", None, "http://example.test/x"),
    ("  ../up  ", BASE, "http://www.example.test/one/up"),
    ("http://example.test/a\x7fb", None, "http://example.test/a%7Fb"),  # DEL is not trimmed
    # spaces and non-ASCII percent-encoded as UTF-8, in path and query
    ("my file.html", BASE, B_DIR + "my%20file.html"),
    ("http://example.test/ü?ü=ü", None, "http://example.test/%C3%BC?%C3%BC=%C3%BC"),
    ("http://example.test/€ 1", None, "http://example.test/%E2%82%AC%201"),
    ("http://example.test/\U0001f600", None, "http://example.test/%F0%9F%98%80"),
    ('http://example.test/<"q">', None, "http://example.test/%3C%22q%22%3E"),
    ("http://example.test/?{x}|^`", None, "http://example.test/?%7Bx%7D%7C%5E%60"),
    # IDN hosts: UTS #46 mapping, then Punycode
    ("http://Bücher.example/", None, "http://xn--bcher-kva.example/"),
    ("http://BÜCHER.example/", None, "http://xn--bcher-kva.example/"),
    ("http://xn--bcher-kva.example/", None, "http://xn--bcher-kva.example/"),
    ("http://straße.example/", None, "http://xn--strae-oqa.example/"),  # non-transitional
    ("http://ｗｗｗ．example。test/", None, "http://www.example.test/"),  # full-width forms
    ("http://ex\u00adample.test/", None, "http://example.test/"),  # soft hyphen vanishes
    ("http://日本語.テスト/", None, "http://xn--wgv71a119e.xn--zckzah/"),
    ("http://\U0001f600.example/", None, "http://xn--e28h.example/"),  # as browsers do
    ("http://%E2%82%AC.example/", None, "http://xn--lzg.example/"),
    ("http://xn--zz.example/", None, Reject("host")),  # not valid Punycode of a name
    ("http://xn--.example/", None, Reject("host")),
    ("http://xn--abc-.example/", None, Reject("host")),  # Punycode of plain "abc"
    ("http://xn--wca.example/", None, Reject("host")),  # of "Ü", which UTS #46 maps to "ü"
    ("http://xn--ab-m1t.example/", None, Reject("host")),  # of "a<ZWJ>b": a joiner out of place
    ("http://XN--N3H.example/", None, "http://xn--n3h.example/"),  # of the snowman: valid
    ("http://\u0301x.example/", None, Reject("host")),  # a leading combining mark
    # IPv4 forms become dotted decimal
    ("http://0x7f.1/", None, "http://127.0.0.1/"),
    ("http://2130706433/", None, "http://127.0.0.1/"),
    ("http://0x7F000001/", None, "http://127.0.0.1/"),
    ("http://017700000001/", None, "http://127.0.0.1/"),
    ("http://127.1/", None, "http://127.0.0.1/"),
    ("http://10.0.258/", None, "http://10.0.1.2/"),
    ("http://1.2.3.4./", None, "http://1.2.3.4/"),
    ("http://１２７.0.0.１/", None, "http://127.0.0.1/"),  # full-width digits map first
    ("http://4294967296/", None, Reject("host")),
    ("http://1.2.3.256/", None, Reject("host")),
    ("http://1.2.3.4.5/", None, Reject("host")),
    ("http://08.1.1.1/", None, Reject("host")),  # 0 means octal, and 8 is no octal digit
    ("http://example.0x10/", None, Reject("host")),  # a numeric last label makes an address
    # IPv6
    ("http://[0:0:0:0:0:0:0:1]:8080/", None, "http://[::1]:8080/"),
    ("http://[2001:DB8::A]/", None, "http://[2001:db8::a]/"),
    ("http://[::1]:80/", None, "http://[::1]/"),
    ("http://[::1%251]/", None, Reject("host")),
    ("http://[::1]:x/", None, Reject("port")),
    # trailing dot in the host is dropped (our choice, rule 6); two are an error
    ("http://example.test./a", None, "http://example.test/a"),
    ("http://EXAMPLE.test.:80/", None, "http://example.test/"),
    ("http://example.test../", None, Reject("host")),
    # empty hosts
    ("http:///", None, Reject("host")),
    ("http://:8080/", None, Reject("host")),
    ("http://user@/", None, Reject("host")),
    ("//", BASE, Reject("host")),
    # userinfo is stripped (rule 5)
    ("http://user:secret@example.test/x", None, "http://example.test/x"),
    ("http://user@EXAMPLE.test:80/", None, "http://example.test/"),
    ("http://a:b@c@example.test/", None, "http://example.test/"),
    ("//u:p@other.test/x", BASE, "http://other.test/x"),
    # fragments removed, whatever they hold
    ("http://example.test/p#a b ü", None, "http://example.test/p"),
    ("http://example.test/#", None, "http://example.test/"),
    ("http://example.test/p?q=1#x?y=2", None, "http://example.test/p?q=1"),
    # ports
    ("http://example.test:65535/", None, "http://example.test:65535/"),
    ("http://example.test:65536/", None, Reject("port")),
    ("http://example.test:99999999999999999999/", None, Reject("port")),
    ("http://example.test:0/", None, Reject("port")),
    ("http://example.test:8o/", None, Reject("port")),
    ("http://example.test: 80/", None, Reject("port")),
    # schemes other than http(s), and relative references without a base
    ("javascript:alert(1)", BASE, Reject("scheme")),
    ("mailto:a@example.test", BASE, Reject("scheme")),
    ("data:text/plain,x", BASE, Reject("scheme")),
    ("tel:+1-555-0100", BASE, Reject("scheme")),
    ("ftp://example.test/", BASE, Reject("scheme")),
    (" JavaScript:void(0)", BASE, Reject("scheme")),
    ("leaf", None, Reject("relative")),
    ("//other.test/", None, Reject("relative")),
    # over-long URLs (rule 10)
    (
        "http://example.test/" + "a" * (DEFAULT_MAX_URL_LENGTH - 20),
        None,
        "http://example.test/" + "a" * (DEFAULT_MAX_URL_LENGTH - 20),
    ),
    ("http://example.test/" + "a" * (DEFAULT_MAX_URL_LENGTH - 19), None, Reject("too_long")),
    ("ü" * 700, BASE, Reject("too_long")),  # short as written, too long once encoded
    ("x" * (4 * DEFAULT_MAX_URL_LENGTH + 1), BASE, Reject("too_long")),
]

TABLE = RESOLUTION_NORMAL + RESOLUTION_ABNORMAL + SYNTAX_AND_SCHEME + BROWSER


def _id(row: Row) -> str:
    text = repr(row[0])
    return text if len(text) <= 40 else text[:37] + "..."


def test_table_has_at_least_80_cases() -> None:
    assert len(TABLE) >= 80
    assert len({(ref, base) for ref, base, _ in TABLE}) == len(TABLE)  # no duplicates


@pytest.mark.parametrize(("ref", "base", "want"), TABLE, ids=[_id(r) for r in TABLE])
def test_rfc_and_whatwg_table(ref: str, base: str | None, want: Want) -> None:
    if isinstance(want, Reject):
        with pytest.raises(URLError) as info:
            normalize(ref, base)
        assert info.value.reason == want.reason
        assert info.value.url == ref  # the caller's text, not a cleaned one
        with pytest.raises(URLError) as general:
            _normalize(ref, base, DEFAULT_MAX_URL_LENGTH)
        assert general.value.reason == want.reason
        return
    got = normalize(ref, base)
    assert got == want
    assert _normalize(ref, base, DEFAULT_MAX_URL_LENGTH) == want  # the general path agrees
    assert normalize(got) == got  # idempotent
    assert normalize(got, BASE) == got  # an absolute URL ignores the base


def test_a_bad_base_is_named_even_beside_an_absolute_url() -> None:
    for ref in ("http://example.test/", "leaf", "http://Example.test/a b"):
        with pytest.raises(URLError) as info:
            normalize(ref, "mailto:x@example.test")
        assert info.value.url == "mailto:x@example.test"
        assert info.value.reason == "base scheme"


def test_max_length_is_the_callers() -> None:
    url = "http://example.test/" + "b" * 200
    assert normalize(url, max_length=220) == url
    with pytest.raises(URLError, match="too_long"):
        normalize(url, max_length=219)
    with pytest.raises(URLError, match="too_long"):
        normalize("b" * 200, BASE, max_length=100)


# -- properties ----------------------------------------------------------------------

_unreserved = string.ascii_letters + string.digits + "-._~"
_label = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8)
_host = (
    st.lists(_label, min_size=1, max_size=3)
    .map(".".join)
    .filter(
        lambda h: not h.rsplit(".", 1)[-1].isdigit() and not h.rsplit(".", 1)[-1].startswith("0x")
    )
)
_segment = st.text(_unreserved + "!$&'()*+,;=:@", max_size=8).filter(lambda s: s not in (".", ".."))
_query_text = st.text(_unreserved + "!$&'()*+,;=:@/?", min_size=1, max_size=12)


@st.composite
def _canonical(draw: st.DrawFn) -> tuple[str, str, int | None, list[str], str | None]:
    """Parts of a URL already in normal form: scheme, host, port, segments, query."""
    scheme = draw(st.sampled_from(["http", "https"]))
    port = draw(st.one_of(st.none(), st.integers(1, 65535)))
    if port == {"http": 80, "https": 443}[scheme]:
        port = None
    return (
        scheme,
        draw(_host),
        port,
        draw(st.lists(_segment, max_size=4)),
        draw(st.one_of(st.none(), _query_text)),
    )


def _spell(draw: st.DrawFn, parts: tuple[str, str, int | None, list[str], str | None]) -> str:
    """One of the many spellings of the same URL that the rules make equal."""
    scheme, host, port, segments, query = parts
    rnd = draw(st.randoms(use_true_random=False))

    def maybe(p: float = 0.3) -> bool:
        return rnd.random() < p

    if maybe():
        scheme = "".join(c.upper() if maybe(0.5) else c for c in scheme)
    if maybe():
        host = "".join(c.upper() if maybe(0.5) else c for c in host)
    if maybe(0.2):
        host += "."
    if maybe(0.2):
        host = "user:pw@" + host
    netloc = host
    if port is not None:
        netloc += f":{'0' * rnd.randint(0, 2)}{port}"
    elif maybe(0.2):
        netloc += ":" + str({"http": 80, "https": 443}[scheme.lower()])
    elif maybe(0.1):
        netloc += ":"

    def spell_text(text: str) -> str:
        out = []
        for c in text:
            if c in _unreserved and maybe(0.2):
                hexits = f"{ord(c):02x}"
                out.append("%" + (hexits.upper() if maybe(0.5) else hexits))
            else:
                out.append(c)
        return "".join(out)

    path_parts = []
    for seg in segments:
        if maybe(0.15):
            path_parts.append(".")
        if maybe(0.15):
            path_parts += ["zz", ".."]
        path_parts.append(spell_text(seg))
    path = "/" + "/".join(path_parts)
    if maybe(0.2):
        path = path.replace("/", "\\")
    url = f"{scheme}://{netloc}{path}"
    if query is not None:
        url += "?" + spell_text(query)
    elif maybe(0.1):
        url += "?"
    if maybe(0.3):
        url += "#" + draw(st.text(max_size=6))
    if maybe(0.2):
        cut = rnd.randint(0, len(url))
        url = url[:cut] + rnd.choice("\t\n\r") + url[cut:]
    if maybe(0.2):
        url = " \x00"[rnd.randint(0, 1)] + url + " \t"
    return url


@st.composite
def _spellings(draw: st.DrawFn) -> tuple[str, list[str]]:
    parts = draw(_canonical())
    scheme, host, port, segments, query = parts
    canonical = f"{scheme}://{host}{'' if port is None else f':{port}'}/" + "/".join(segments)
    if query:
        canonical += "?" + query
    return canonical, [_spell(draw, parts) for _ in range(4)]


@settings(max_examples=300, deadline=None)
@given(_spellings())
def test_equivalent_spellings_share_one_key(case: tuple[str, list[str]]) -> None:
    canonical, spellings = case
    assert normalize(canonical) == canonical
    for spelling in spellings:
        assert normalize(spelling) == canonical, spelling
        assert url_key(normalize(spelling)) == url_key(canonical)


_ref_chars = st.sampled_from(
    list("/.?#%:@\\ \t-_~!$&'()*+,;=[]<>\"{}|^`")
    + ["%2e", "%41", "ü", "..", "./", "../", "//", "http:", "HTTP://", "h.test", ":80"]
)
_ref = st.lists(
    st.one_of(_ref_chars, st.text(string.ascii_letters + string.digits, min_size=1, max_size=4)),
    max_size=12,
).map("".join)
# Clean ASCII references, the fast path's diet.
_clean_ref = st.lists(
    st.sampled_from(
        [
            "../",
            "./",
            "..",
            ".",
            "a",
            "b.html",
            "/",
            "//",
            "?q=1",
            "#f",
            "h.test",
            "http://",
            "https://",
            ":",
            "@",
            ":8080",
            "x:y",
            "%41",
            "\\",
        ]
    ),
    max_size=8,
).map("".join)
_bases = st.sampled_from(
    [
        BASE,
        "https://h.test/",
        "http://h.test:8080/a/b/c?x#y",
        "http://[::1]/d/",
        "http://xn--bcher-kva.test/%C3%BC/x",
    ]
)


@settings(max_examples=400, deadline=None)
@given(_ref, st.one_of(st.none(), _bases))
def test_normalize_is_idempotent(ref: str, base: str | None) -> None:
    try:
        once = normalize(ref, base)
    except URLError:
        return
    assert normalize(once) == once
    assert normalize(once, base) == once


def _outcome(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except URLError as exc:
        return f"URLError {exc.reason} {exc.url!r}"


@settings(max_examples=500, deadline=None)
@given(st.one_of(_clean_ref, _ref, st.text(max_size=30)), st.one_of(st.none(), _bases))
def test_fast_path_agrees_with_the_general_path(ref: str, base: str | None) -> None:
    fast = _outcome(lambda: normalize(ref, base))
    assert fast == _outcome(lambda: _normalize(ref, base, DEFAULT_MAX_URL_LENGTH))
