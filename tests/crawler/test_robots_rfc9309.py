"""crawler.web.robots against a table written from RFC 9309.

Rows are (robots.txt, URL path, allowed?) for our user agent, grouped by the
RFC section they come from; the rule numbers in comments are those of the
rules list in crawler/web/robots.py's docstring (our choices where the RFC is
silent or loose). Then the size cap (§2.5), the fetch-status decision table
(§2.3.1), and a cross-check against protego where protego follows the RFC.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protego import Protego

from crawler.web.robots import DEFAULT_MAX_ROBOTS_BYTES, RobotsRules
from crawler.web.urls import normalize, parse

UA = "KVCrawl/2.1 (+http://127.0.0.1/bot)"
NOW = 5_000_000.0
SITE = "http://robots.example.test"

Row = tuple[str | bytes, str, bool]  # (robots.txt, path and query, allowed for UA)


def rules(body: str | bytes, *, user_agent: str = UA) -> RobotsRules:
    data = body.encode("utf-8") if isinstance(body, str) else body
    return RobotsRules.from_response(200, data, user_agent=user_agent, now=NOW)


def star(*lines: str) -> str:
    """A robots.txt with one group for everyone."""
    return "User-agent: *\n" + "\n".join(lines) + "\n"


# §2.2.2: rules are prefixes of path+query; the longest match wins; Allow wins a tie.
MATCHING: list[Row] = [
    (star("Disallow: /shop"), "/shop", False),
    (star("Disallow: /shop"), "/shop.html", False),
    (star("Disallow: /shop"), "/shop/cart?x=1", False),
    (star("Disallow: /shop"), "/Shop", True),  # paths are case-sensitive
    (star("Disallow: /shop"), "/workshop", True),
    (star("Disallow: /shop"), "/?q=/shop", True),
    (star("Disallow: /shop/"), "/shop", True),
    (star("Disallow: /shop/"), "/shop/", False),
    (star("Allow: /p", "Disallow: /"), "/page", True),
    (star("Allow: /p", "Disallow: /"), "/", False),
    (star("Disallow: /", "Allow: /p"), "/page", True),  # order does not matter
    (star("Allow: /docs/", "Disallow: /docs/internal/"), "/docs/internal/a", False),
    (star("Allow: /docs/", "Disallow: /docs/internal/"), "/docs/a", True),
    (star("Allow: /same", "Disallow: /same"), "/same/x", True),  # a tie goes to Allow
    (star("Disallow: /same", "Allow: /same"), "/same/x", True),
    (star("Allow: /*q", "Disallow: /a*"), "/aq", True),  # a tie of wildcards too
    (star("Disallow: /a", "Allow: /a$"), "/a", True),  # "$" counts: 3 octets beat 2
    (star("Disallow: /a", "Allow: /a$"), "/ab", False),
    (star("Disallow: /*?"), "/list?page=2", False),
    (star("Disallow: /*?"), "/list", True),
    (star("Disallow: /list?"), "/list?", False),
    (star("Disallow:"), "/anything", True),  # an empty rule is no rule
    (star("Allow:", "Disallow: /x"), "/x", False),
    (star(), "/x", True),  # a group without rules
    ("", "/x", True),  # an empty file
    (star("Disallow: /"), "/robots.txt", True),  # robots.txt itself, always
    (star("Disallow: /"), "/robots.txt?v=1", False),
]

# §2.2.2: percent-encoding before comparison (rule 6).
ENCODING: list[Row] = [
    (star("Disallow: /%7Euser"), "/~user/x", False),  # unreserved: decoded on both sides
    (star("Disallow: /~user"), "/%7euser/x", False),
    (star("Disallow: /a%3cb"), "/a%3Cb", False),  # hex digits' case does not matter
    (star("Disallow: /a%3Cb"), "/a%3cb", False),
    (star("Disallow: /a<b"), "/a%3Cb", False),  # what must be encoded is encoded
    (star("Disallow: /a/b"), "/a%2Fb", True),  # "%2F" is not "/" in a path
    (star("Disallow: /a%2Fb"), "/a/b", True),
    (star("Disallow: /a%2fb"), "/a%2Fb", False),
    (star("Disallow: /ツ"), "/%E3%83%84", False),  # RFC table: UTF-8, then encoded
    (star("Disallow: /%E3%83%84"), "/ツ", False),
    (star("Disallow: /%62%61%7A"), "/baz", False),  # RFC table: /%62%61%7A is /baz
    (
        star("Disallow: /foo/bar?baz=https://foo.bar"),
        "/foo/bar?baz=https%3A%2F%2Ffoo.bar",
        False,
    ),  # RFC table row 2: ":" and "/" in a query
    (star("Disallow: /q?u=%2F%3A"), "/q?u=/:", False),
    (star("Disallow: /q?a=b%26c"), "/q?a=b&c", True),  # "&" delimits fields: kept apart
    (star("Disallow: /q?a=b%3Dc"), "/q?a=b=c", True),
    (star("Disallow: /a b"), "/a%20b", False),
    (star("Disallow: /100%"), "/100%25", False),  # a stray "%" is "%25"
    (star("Disallow: /100%"), "/100", True),
    (star("Disallow: /file-%2A.html"), "/file-*.html", False),  # RFC: a literal "*"
    (star("Disallow: /file-%2A.html"), "/file-x.html", True),
]

# §2.2.3: "*" and "$" (rule 5).
WILDCARDS: list[Row] = [
    (star("Disallow: /*.gif$"), "/a.gif", False),
    (star("Disallow: /*.gif$"), "/a/b/c.gif", False),
    (star("Disallow: /*.gif$"), "/a.gif?size=2", True),
    (star("Disallow: /*.gif$"), "/a.gifs", True),
    (star("Disallow: /*.gif$"), "/a.GIF", True),
    (star("Disallow: /private*/"), "/privateer/x", False),
    (star("Disallow: /private*/"), "/private", True),
    (star("Disallow: /a*b*c"), "/a-b-c", False),
    (star("Disallow: /a*b*c"), "/a-c-b", True),
    (star("Disallow: /a**b"), "/a--b", False),
    (star("Disallow: *"), "/x", False),  # a pattern may start with "*"
    (star("Disallow: *.pdf"), "/docs/a.pdf", False),
    (star("Disallow: /end$"), "/end", False),
    (star("Disallow: /end$"), "/end/", True),
    (star("Disallow: /end$"), "/end$", True),  # "$" is only the anchor...
    (star("Disallow: /a$b"), "/a$b", False),  # ...except inside a pattern: a literal
    (star("Disallow: /a$b"), "/ab", True),
    (star("Allow: /$", "Disallow: /"), "/", True),
    (star("Allow: /$", "Disallow: /"), "/index.html", False),
    (star("Disallow: /", "Allow: /d/index.html"), "/d/", False),  # no index.html magic
    (star("Disallow: /", "Allow: /d/index.html"), "/d/index.html", True),
    (star("Disallow: /a*$"), "/abc", False),
    (star("Disallow: /ab*ba$"), "/aba", True),  # head and tail may not overlap
    (star("Disallow: /ab*ba$"), "/abba", False),
    (star("Disallow: /" + "*a" * 30 + "$"), "/" + "a" * 3000, False),  # no backtracking
    (star("Disallow: /" + "*a" * 30 + "$"), "/" + "a" * 3000 + "b", True),
]

# §2.2.1: which group is ours (rule 3); §2.1 / §2.2.4: what makes a group (rule 2).
GROUPS: list[Row] = [
    ("User-agent: *\nDisallow: /\n\nUser-agent: kvcrawl\nDisallow: /x\n", "/a", True),
    ("User-agent: *\nDisallow: /\n\nUser-agent: kvcrawl\nDisallow: /x\n", "/x", False),
    ("User-agent: KvCrAwL\nDisallow: /x\n", "/x", False),  # case-insensitive
    ("User-agent: KVCrawl/1.0\nDisallow: /x\n", "/x", False),  # the token, version aside
    ("User-agent: kv\nDisallow: /\n", "/x", True),  # a prefix of our token is not us
    ("User-agent: kvcrawler\nDisallow: /\n", "/x", True),
    ("User-agent: kvcrawl-news\nDisallow: /\n", "/x", True),
    ("User-agent: other\nDisallow: /\n\nUser-agent: *\nDisallow: /s\n", "/a", True),
    ("User-agent: other\nDisallow: /\n\nUser-agent: *\nDisallow: /s\n", "/s", False),
    ("User-agent: other\nDisallow: /\n", "/a", True),  # no group for us, no "*"
    ("User-agent: a\nUser-agent: kvcrawl\nUser-agent: b\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\n\nUser-agent: other\nDisallow: /x\n", "/x", False),  # blank: no split
    ("User-agent: kvcrawl\nFoo: bar\nUser-agent: o\nDisallow: /x\n", "/x", False),  # §2.2.4
    ("User-agent: kvcrawl\nSitemap: /s.xml\nUser-agent: o\nDisallow: /x\n", "/x", False),
    # Crawl-delay is no RFC 9309 rule either: it ends no run of User-agent lines (rule 2)
    ("User-agent: kvcrawl\nCrawl-delay: 1\nUser-agent: o\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\nCrawl-delay: 5\nUser-agent: other\nDisallow: /x\n", "/x", False),
    ("User-agent: other\nCrawl-delay: 5\nUser-agent: kvcrawl\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\ncrawl delay: 5\nUser-agent: other\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\nRequest-rate: 1/5\nUser-agent: o\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\nHost: a.test\nUser-agent: o\nDisallow: /x\n", "/x", False),
    ("User-agent: kvcrawl\n# one\n\n# two\nUser-agent: o\nDisallow: /x\n", "/x", False),
    (
        "User-agent: kvcrawl\nCrawl-delay: 5\nSitemap: /s.xml\nFoo: bar\n\n# c\n"
        "User-agent: other\nDisallow: /x\n",
        "/x",
        False,
    ),  # all of them at once
    # Google's robots_test.cc, ID_LineSyntax_Groups_OtherRules, with our token for BarBot
    ("User-agent: kvcrawl\nSitemap: https://foo.bar/sitemap\nUser-agent: *\nDisallow: /\n",
     "/", False),
    ("User-agent: kvcrawl\nInvalid-Unknown-Line: unknown\nUser-agent: *\nDisallow: /\n",
     "/", False),
    # a rule ends the run: a Crawl-delay after it leaves the next User-agent a new group
    ("User-agent: kvcrawl\nDisallow: /a\nCrawl-delay: 5\nUser-agent: o\nDisallow: /x\n",
     "/x", True),
    ("User-agent: o\nDisallow: /x\nCrawl-delay: 5\nUser-agent: kvcrawl\nDisallow: /a\n",
     "/x", True),
    ("User-agent: o\nDisallow: /x\nUser-agent: kvcrawl\nDisallow: /y\n", "/x", True),
    (
        "User-agent: kvcrawl\nDisallow: /a\n\nUser-agent: *\nDisallow: /b\n\n"
        "User-agent: KVCRAWL\nDisallow: /c\n",
        "/c",
        False,
    ),  # our groups merged
    (
        "User-agent: kvcrawl\nDisallow: /a\n\nUser-agent: *\nDisallow: /b\n\n"
        "User-agent: KVCRAWL\nDisallow: /c\n",
        "/b",
        True,
    ),
    ("User-agent: kvcrawl\nDisallow: /d/\n\nUser-agent: kvcrawl\nAllow: /d/ok\n", "/d/ok", True),
    (
        "User-agent: *\nDisallow: /a\n\nUser-agent: o\nDisallow: /\n\nUser-agent: *\n"
        "Disallow: /b\n",
        "/b",
        False,
    ),  # "*" groups merged as well
    ("User-agent: *\nDisallow: /\n\nUser-agent: kvcrawl\n", "/x", True),  # ours, empty
    ("Disallow: /x\nUser-agent: *\nDisallow: /y\n", "/x", True),  # no group: ignored
    ("Disallow: /x\nUser-agent: *\nDisallow: /y\n", "/y", False),
    ("User-agent: * # everyone\nDisallow: /x\n", "/x", False),
    ("User-agent:*\nDisallow:/x\n", "/x", False),
    ("User-agent: *bot\nDisallow: /\n", "/x", True),  # neither "*" nor our token
]

# §2.1 / §2.2: the file's syntax (rule 1).
SYNTAX: list[Row] = [
    ("USER-AGENT: *\nDISALLOW: /x\n", "/x", False),
    ("uSeR-aGeNt: *\nAlLoW: /x\ndIsAlLoW: /\n", "/x", True),
    ("User-agent :  *  \n   Disallow  :   /x   \n", "/x", False),
    ("User-agent: *\nDisallow: /x # not /y\n# Disallow: /y\n", "/y", True),
    ("User-agent: *\nDisallow: /x # not /y\n# Disallow: /y\n", "/x", False),
    ("User-agent: *\nDisallow: /a#b\n", "/ab", False),  # "#" always starts a comment
    ("User-agent: *\nNoindex: /x\nDisallow: /y\n", "/x", True),  # unknown lines ignored
    ("User-agent: *\nDissallow: /x\n", "/x", False),  # a typo Google reads too
    ("User agent: *\nDisallow: /x\n", "/x", False),
    ("User-agent *\nDisallow /x\n", "/x", False),  # two words, no colon
    ("User-agent: *\nDisallow / x\n", "/x", True),  # three words: not a rule
    ("User-agent: *\nDisallow: x\n", "/x", True),  # not a path-pattern
    ("User-agent: *\nDisallow: http://robots.example.test/x\n", "/x", True),
    (b"\xef\xbb\xbfUser-agent: *\nDisallow: /x\n", "/x", False),  # a BOM
    (b"\xef\xbbUser-agent: *\nDisallow: /x\n", "/x", False),  # two bytes of one
    (b"\xefUser-agent: *\nDisallow: /x\n", "/x", False),  # one byte of one
    (b"\xef\x80\x80User-agent: *\nDisallow: /x\n", "/x", True),  # U+F000: a character
    ("User-agent: *\r\nDisallow: /x\r\n", "/x", False),  # CRLF
    ("User-agent: *\rDisallow: /x\rDisallow: /y", "/y", False),  # CR alone, no final EOL
    ("User-agent: *\nDisallow: /a\x0cDisallow: /b\n", "/b", True),  # form feed ends no line
    ("User-agent: *\nDisallow: /a\u2028Disallow: /b\n", "/b", True),
    (b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /b\n", "/b", False),  # bad UTF-8
    (b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /b\n", "/caf%C3%A9", True),
    (b"\x00\xff<html>\nUser-agent: *\nDisallow: /x\n\x00\n", "/x", False),  # junk around
]

TABLE = MATCHING + ENCODING + WILDCARDS + GROUPS + SYNTAX


def _id(row: Row) -> str:
    body = row[0] if isinstance(row[0], str) else row[0].decode("latin-1")
    text = f"{body!r}:{row[1]}"
    return text if len(text) <= 60 else text[:57] + "..."


def test_table_size() -> None:
    assert len(TABLE) >= 100


@pytest.mark.parametrize(("body", "path", "allowed"), TABLE, ids=[_id(r) for r in TABLE])
def test_rfc9309_table(body: str | bytes, path: str, allowed: bool) -> None:
    r = rules(body)
    assert r.state == "rules"
    assert r.can_fetch(SITE + path) is allowed
    assert r.can_fetch(path) is allowed  # a bare path+query answers the same
    assert r.can_fetch(SITE + path + "#fragment") is allowed
    n = normalize(SITE + path, max_length=1 << 20)  # the engine asks with the URL it split once
    assert r.can_fetch(parse(n)) is r.can_fetch(n)


@pytest.mark.parametrize("user_agent", ["other/1.0", "Other", "o"])
def test_the_other_robots_groups(user_agent: str) -> None:
    body = (
        "User-agent: kvcrawl\nCrawl-delay: 1\nUser-agent: other\nUser-agent: o\n"
        "Disallow: /x\n\nUser-agent: *\nDisallow: /star\n"
    )
    r = rules(body, user_agent=user_agent)
    assert not r.can_fetch(SITE + "/x")
    assert r.can_fetch(SITE + "/star")


@pytest.mark.parametrize(
    ("body", "delays"),
    [
        # the issue's example: one group, so its Crawl-delay is every one of its agents'
        ("User-agent: kvcrawl\nCrawl-delay: 5\nUser-agent: other\nDisallow: /x\n",
         {"kvcrawl": 5.0, "other": 5.0, "third": None}),
        # between the User-agent lines of a group: it is that group's, ours too
        ("User-agent: other\nCrawl-delay: 5\nUser-agent: kvcrawl\nDisallow: /x\n\n"
         "User-agent: *\nCrawl-delay: 9\n",
         {"kvcrawl": 5.0, "other": 5.0, "third": 9.0}),
        # after a group's rules it is still that group's, not the next one's
        ("User-agent: other\nDisallow: /\nCrawl-delay: 7\nUser-agent: kvcrawl\nDisallow: /x\n",
         {"kvcrawl": None, "other": 7.0, "third": None}),
        # before any User-agent line it is no group's
        ("Crawl-delay: 3\nUser-agent: *\nDisallow: /x\n",
         {"kvcrawl": None, "other": None, "third": None}),
        # a group's first valid one, in file order, whatever lines lie around it
        ("User-agent: kvcrawl\nCrawl-delay: x\nSitemap: /s\nUser-agent: o\nCrawl-delay: 2\n"
         "Disallow: /x\nCrawl-delay: 4\n\nUser-agent: KVCrawl\nCrawl-delay: 1\n",
         {"kvcrawl": 2.0, "o": 2.0, "other": None}),
    ],
)
def test_crawl_delay_applies_to_the_group_it_is_in(
    body: str, delays: dict[str, float | None]
) -> None:
    for agent, delay in delays.items():
        assert rules(body, user_agent=agent).crawl_delay == delay, agent


def test_crawl_delay_comes_from_our_groups() -> None:
    body = (
        "User-agent: *\nCrawl-delay: 9\nDisallow:\n\nUser-agent: kvcrawl\nCrawl-delay: nan\n"
        "Crawl-delay: 2.5\nCrawl-delay: 4\n"
    )
    assert rules(body).crawl_delay == 2.5  # the first valid one
    assert rules(body, user_agent="other").crawl_delay == 9.0
    assert rules("User-agent: *\nCrawl-delay: -1\nCrawl-delay: inf\n").crawl_delay is None


def test_without_a_rule_between_them_two_blocks_are_one_group() -> None:
    # A blank line and a Crawl-delay end nothing (RFC 9309 §2.2): this is one group for
    # "*" and for us, and its first valid Crawl-delay is everyone's.
    body = "User-agent: *\nCrawl-delay: 9\n\nUser-agent: kvcrawl\nCrawl-delay: 0.5\n"
    assert rules(body).crawl_delay == 9.0
    assert rules(body, user_agent="other").crawl_delay == 9.0


def test_a_url_with_authority_only_is_the_root() -> None:
    r = rules(star("Disallow: /$"))
    assert not r.can_fetch(SITE)
    assert r.can_fetch(SITE + "?")  # "/?" is not "/"
    r = rules(star("Disallow: /?"))
    assert not r.can_fetch(SITE + "?q=1")
    assert r.can_fetch(SITE)


# -- §2.5: the size cap -----------------------------------------------------------------


def _padded(rule_at: int, rule: bytes, *, eol: bytes = b"\n") -> bytes:
    """A body whose ``rule`` line starts at byte ``rule_at`` (comment padding before it)."""
    head = b"User-agent: *" + eol
    pad_line = b"#" + b"p" * 98 + eol
    body = head + pad_line * ((rule_at - len(head)) // len(pad_line))
    body += b"#" * (rule_at - len(body) - len(eol)) + eol
    assert len(body) == rule_at
    return body + rule + eol


def test_at_least_500_kib_are_parsed() -> None:
    assert DEFAULT_MAX_ROBOTS_BYTES >= 500 * 1024
    body = _padded(500 * 1024 - 20, b"Disallow: /late")
    assert len(body) <= 500 * 1024
    r = rules(body)
    assert not r.truncated and not r.can_fetch(SITE + "/late")


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_what_lies_past_the_cap_is_not_read(eol: bytes) -> None:
    body = _padded(DEFAULT_MAX_ROBOTS_BYTES - 8, b"Disallow: /late-and-cut", eol=eol)
    body += b"Disallow: /after" + eol
    r = rules(body)
    assert r.truncated and r.size <= DEFAULT_MAX_ROBOTS_BYTES
    assert r.can_fetch(SITE + "/late")  # the cut line is dropped, not shortened
    assert r.can_fetch(SITE + "/after")


# -- §2.3.1: what each kind of answer means -----------------------------------------------


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (200, "rules"),
        (203, "rules"),
        (204, "rules"),
        (299, "rules"),  # §2.3.1.1
        (301, "allow_all"),
        (302, "allow_all"),
        (307, "allow_all"),
        (308, "allow_all"),  # §2.3.1.2
        (400, "allow_all"),
        (401, "allow_all"),
        (403, "allow_all"),
        (404, "allow_all"),  # §2.3.1.3
        (410, "allow_all"),
        (418, "allow_all"),
        (451, "allow_all"),
        (499, "allow_all"),
        (429, "disallow_all_for_now"),  # our choice: "slow down" is not "no file"
        (500, "disallow_all_for_now"),
        (502, "disallow_all_for_now"),  # §2.3.1.4
        (503, "disallow_all_for_now"),
        (504, "disallow_all_for_now"),
        (599, "disallow_all_for_now"),
        (None, "disallow_all_for_now"),
        (100, "disallow_all_for_now"),
        (600, "disallow_all_for_now"),
    ],
)
def test_status_decision_table(status: int | None, state: str) -> None:
    body = b"User-agent: *\nDisallow: /private\n"
    r = RobotsRules.from_response(status, body, user_agent=UA, now=NOW)
    assert r.state == state
    assert r.status == status
    want = {
        "rules": (True, False),
        "allow_all": (True, True),
        "disallow_all_for_now": (False, False),
    }[state]
    assert (r.can_fetch(SITE + "/public"), r.can_fetch(SITE + "/private")) == want
    assert r.can_fetch(SITE + "/robots.txt")
    assert (r.retry_at is not None) == (state == "disallow_all_for_now")


# -- a cross-check: protego, where it follows RFC 9309 ------------------------------------

# No "?" in patterns (protego counts it as "%3F", three octets), no "$" inside a
# pattern and no "index.html" (its two departures), one "*" group.
_pattern = st.builds(
    lambda head, body, anchored: head + body + ("$" if anchored else ""),
    st.sampled_from(["/", "*", "/a", "/*"]),
    st.text("ab/.-*=", max_size=6),
    st.booleans(),
)
_rule = st.tuples(st.sampled_from(["Allow", "Disallow"]), _pattern).map(": ".join)
_path = st.text("ab/.-=?", max_size=10).map(lambda p: "/" + p)


@settings(max_examples=400, deadline=None)
@given(st.lists(_rule, max_size=8), st.lists(_path, min_size=1, max_size=6))
def test_agrees_with_protego_where_protego_follows_the_rfc(
    lines: list[str], paths: list[str]
) -> None:
    text = star(*lines)
    ours = rules(text)
    theirs = Protego.parse(text)
    for path in paths:
        url = SITE + path
        assert ours.can_fetch(url) == theirs.can_fetch(url, "kvcrawl"), (lines, path)


# RFC 9309 §2.2.4 (and Google's parser): lines the RFC does not define neither end a group
# nor start one. protego agrees for Sitemap, Host, comments and blank lines, but ends a
# run of User-agent lines at Crawl-delay, Request-rate and unknown keys; so a file with
# such lines must answer as protego answers the same file without them.
_AGENTS = ["User-agent: kvcrawl", "User-agent: other", "User-agent: *"]
_RULES = ["Disallow: /a", "Allow: /a/b", "Disallow: /", "Disallow:", "Allow: /b"]
_FOLLOWED = ["Sitemap: http://robots.example.test/s.xml", "Host: robots.example.test",
             "# a comment", ""]
_UNDEFINED = ["Crawl-delay: 5", "crawl delay: 1", "Request-rate: 1/5", "Foo: bar"]
_others = st.lists(st.sampled_from(_FOLLOWED + _UNDEFINED), max_size=2)


def _each_then(lines: list[str]) -> st.SearchStrategy[list[str]]:
    """Some of ``lines``, each followed by a few lines that are neither agents nor rules."""
    return st.lists(st.tuples(st.sampled_from(lines), _others), max_size=3).map(
        lambda pairs: [line for first, rest in pairs for line in (first, *rest)]
    )


_group = st.tuples(_each_then(_AGENTS), _each_then(_RULES)).map(lambda g: g[0] + g[1])
_file = st.tuples(_others, st.lists(_group, max_size=4)).map(
    lambda f: f[0] + [line for group in f[1] for line in group]
)


@settings(max_examples=500, deadline=None)
@given(_file)
def test_groups_agree_with_protego_once_undefined_lines_are_dropped(lines: list[str]) -> None:
    ours = rules("\n".join(lines) + "\n")
    kept = [line for line in lines if line not in _UNDEFINED]
    theirs = Protego.parse("\n".join(kept) + "\n")
    for path in ("/", "/a", "/a/b", "/b", "/c"):
        assert ours.can_fetch(SITE + path) == theirs.can_fetch(SITE + path, "kvcrawl"), (
            lines,
            path,
        )


_any_line = st.one_of(
    st.sampled_from(
        [
            "User-agent: *",
            "User-agent: kvcrawl",
            "User-agent: other",
            "Allow: /",
            "Disallow: /",
            "Disallow:",
            "Crawl-delay: 1",
            "Sitemap: /s",
            "#",
            "",
        ]
    ),
    st.tuples(
        st.sampled_from(["Allow", "Disallow", "allow", "DISALLOW"]),
        st.text(string.printable + "ü$*%", max_size=12),
    ).map(": ".join),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_any_line, max_size=15), st.text(max_size=20))
def test_any_file_and_any_url_give_an_answer(lines: list[str], path: str) -> None:
    r = rules("\n".join(lines))
    assert isinstance(r.can_fetch(SITE + "/" + path), bool)
    assert isinstance(r.can_fetch(path), bool)
    assert r.can_fetch(SITE + "/robots.txt")
