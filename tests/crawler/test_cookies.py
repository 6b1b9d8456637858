"""Cookies per RFC 6265: the pure rules (crawler.web.cookies), the bounds of what the
fetcher keeps (crawler.net.fetch), and the jar on disk (crawler.state.cookiestore)."""

from __future__ import annotations

from pathlib import Path

import pytest
from publicsuffixlist import PublicSuffixList

import kvstore
from crawler.net.answer import MAX_SET_COOKIE_BYTES, set_cookie_lines
from crawler.state.cookiestore import COOKIES_NAME, CookieJar
from crawler.web import cookies as ck
from crawler.web.cookies import (
    MAX_COOKIE_BYTES,
    MAX_COOKIES_PER_SITE,
    MAX_SITE_BYTES,
    Cookie,
    cookie_header,
    parse_cookie_date,
    parse_set_cookie,
)
from crawler.web.urls import parse

PSL = PublicSuffixList()
NOW = 1_700_000_000.0


def got(lines: list[str], host: str = "www.example.com", path: str = "/a/b",
        old: list[Cookie] | None = None, now: float = NOW) -> list[Cookie]:
    """The site's cookies after an answer for ``host`` ``path`` set ``lines``."""
    new = ck.receive(old or [], lines, host=host, path=path, now=now, suffixes=PSL)
    return list(old or []) if new is None else new


def header(cookies: list[Cookie], url: str, now: float = NOW) -> str:
    u = parse(url)
    return cookie_header(cookies, scheme=u.scheme, host=u.host,
                         path=u.target.partition("?")[0], now=now)


class TestParse:
    def test_name_value_and_every_attribute(self) -> None:
        c = parse_set_cookie("SID=31d4; Path=/docs; Domain=.Example.COM; Secure; HttpOnly; "
                             "Expires=Wed, 09 Jun 2021 10:18:14 GMT; Max-Age=60; SameSite=Lax")
        assert c is not None
        assert (c.name, c.value, c.path, c.domain) == ("SID", "31d4", "/docs", "example.com")
        assert (c.secure, c.http_only, c.same_site, c.max_age) == (True, True, "lax", 60)
        assert c.expires == 1623233894.0

    def test_whitespace_is_trimmed_and_the_value_may_hold_equals_signs(self) -> None:
        c = parse_set_cookie("  a  =  b=c==  ;  path = /x ")
        assert c is not None and (c.name, c.value, c.path) == ("a", "b=c==", "/x")

    @pytest.mark.parametrize("line", ["novalue", "=v", " =v", "a\x01=b", "a=b\x7f", "a=b\nc"])
    def test_lines_to_ignore(self, line: str) -> None:
        assert parse_set_cookie(line) is None

    def test_the_last_valid_attribute_wins(self) -> None:
        c = parse_set_cookie("a=b; Max-Age=10; Max-Age=x1; Path=/p; Path=/q; "
                             "Expires=Wed, 09 Jun 2021 10:18:14 GMT; Expires=never")
        assert c is not None
        assert (c.max_age, c.path, c.expires) == (10, "/q", 1623233894.0)

    def test_domain_path_and_max_age_forms(self) -> None:
        c = parse_set_cookie("a=b; Domain=; Path=relative; Max-Age=-5")
        assert c is not None and (c.domain, c.path, c.max_age) == ("", None, -5)
        assert parse_set_cookie("a=b; Max-Age=-") == parse_set_cookie("a=b")
        assert parse_set_cookie("a=b; Max-Age=1.5") == parse_set_cookie("a=b")

    def test_a_line_over_4096_bytes_is_ignored(self) -> None:
        base = "n=; Path=/"
        assert parse_set_cookie(base.replace("=", "=" + "v" * (MAX_COOKIE_BYTES - len(base)), 1))
        assert parse_set_cookie(base.replace("=", "=" + "v" * (MAX_COOKIE_BYTES + 1 - len(base)),
                                             1)) is None


class TestCookieDate:
    @pytest.mark.parametrize(("text", "year"), [
        ("Sun, 06 Nov 1994 08:49:37 GMT", 1994),  # RFC 1123
        ("Sunday, 06-Nov-94 08:49:37 GMT", 1994),  # RFC 850: 70..99 -> 19xx
        ("Sun Nov  6 08:49:37 1994", 1994),  # asctime
        ("06 Nov 2069 08:49:37", 2069),  # 0..69 -> 20xx
        ("Nov 06 08:49:37 69", 2069),
        ("08:49:37 06 nov 1994 garbage", 1994),
    ])
    def test_the_lenient_algorithm(self, text: str, year: int) -> None:
        from datetime import UTC, datetime

        when = parse_cookie_date(text)
        assert when is not None
        d = datetime.fromtimestamp(when, UTC)
        assert (d.year, d.month, d.day, d.hour, d.minute, d.second) == (year, 11, 6, 8, 49, 37)

    @pytest.mark.parametrize("text", ["", "tomorrow", "30 Feb 2020 00:00:00", "06 Nov 1600 1:2:3",
                                      "32 Jan 2020 00:00:00", "06 Nov 1994 24:00:00",
                                      "06 Nov 1994"])
    def test_no_date(self, text: str) -> None:
        assert parse_cookie_date(text) is None


class TestStorageModel:
    def test_no_domain_makes_a_host_only_cookie_sent_to_that_host_only(self) -> None:
        jar = got(["a=1; Path=/"])
        assert jar[0].host_only and jar[0].domain == "www.example.com"
        assert header(jar, "http://www.example.com/") == "a=1"
        assert header(jar, "http://shop.example.com/") == ""
        assert header(jar, "http://sub.www.example.com/") == ""

    def test_a_domain_cookie_reaches_the_domain_and_its_subdomains(self) -> None:
        jar = got(["a=1; Domain=example.com; Path=/"])
        assert not jar[0].host_only
        for url in ("http://example.com/", "http://shop.example.com/", "http://a.b.example.com/"):
            assert header(jar, url) == "a=1", url
        assert header(jar, "http://badexample.com/") == ""
        assert header(jar, "http://example.com.evil.test/") == ""

    @pytest.mark.parametrize(("host", "domain"), [
        ("www.example.co.uk", "co.uk"), ("www.example.com", "com"), ("h0.test", "test"),
        ("user.github.io", "github.io")])
    def test_a_cookie_for_a_public_suffix_is_refused(self, host: str, domain: str) -> None:
        assert got([f"a=1; Domain={domain}"], host=host) == []
        assert got([f"a=1; Domain=.{domain}"], host=host) == []

    def test_a_public_suffix_host_setting_its_own_domain_gets_a_host_only_cookie(self) -> None:
        jar = got(["a=1; Domain=github.io"], host="github.io")
        assert jar[0].host_only and jar[0].domain == "github.io"
        assert header(jar, "https://user.github.io/") == ""

    @pytest.mark.parametrize(("host", "domain"), [
        ("www.example.com", "other.com"), ("www.example.com", "shop.example.com"),
        ("www.example.com", "ample.com"), ("127.0.0.1", "0.0.1")])
    def test_a_domain_the_host_does_not_domain_match_is_refused(self, host: str,
                                                                 domain: str) -> None:
        assert got([f"a=1; Domain={domain}"], host=host) == []

    def test_an_ip_address_is_its_own_site_and_matches_only_itself(self) -> None:
        jar = got(["a=1; Domain=127.0.0.1; Path=/"], host="127.0.0.1")
        assert header(jar, "http://127.0.0.1:8080/") == "a=1"
        assert ck.site_of("127.0.0.1", PSL) == "127.0.0.1"
        assert ck.site_of("[::1]", PSL) == "[::1]"

    def test_sites(self) -> None:
        assert ck.site_of("www.example.co.uk", PSL) == "example.co.uk"
        assert ck.site_of("a.b.example.com", PSL) == "example.com"
        assert ck.site_of("h0.test", PSL) == "h0.test"
        assert ck.site_of("localhost", PSL) == "localhost"

    def test_default_path_and_path_match(self) -> None:
        assert [ck.default_path(p) for p in ("", "/", "/a", "/a/", "/a/b", "/a/b/c")] == \
            ["/", "/", "/", "/a", "/a", "/a/b"]
        assert got(["a=1"], path="/docs/page")[0].path == "/docs"
        assert ck.path_match("/docs", "/docs") and ck.path_match("/docs/x", "/docs")
        assert ck.path_match("/docs/x", "/docs/") and ck.path_match("/", "/")
        assert not ck.path_match("/docsx", "/docs") and not ck.path_match("/doc", "/docs")
        jar = got(["a=1; Path=/docs"])
        assert header(jar, "http://www.example.com/docs?q=1") == "a=1"
        assert header(jar, "http://www.example.com/docs/web/x") == "a=1"
        assert header(jar, "http://www.example.com/docsx") == ""
        assert header(jar, "http://www.example.com/") == ""

    def test_secure_cookies_only_over_https(self) -> None:
        jar = got(["s=1; Secure; Path=/", "p=2; Path=/"])
        assert header(jar, "https://www.example.com/") == "s=1; p=2"
        assert header(jar, "http://www.example.com/") == "p=2"

    def test_expiry_max_age_wins_over_expires_and_none_is_a_session_cookie(self) -> None:
        jar = got(["a=1; Expires=Wed, 09 Jun 2021 10:18:14 GMT; Max-Age=100; Path=/",
                   "s=1; Path=/"])
        assert {c.name: c.expires for c in jar} == {"a": NOW + 100, "s": None}
        assert header(jar, "http://www.example.com/", now=NOW + 99) == "a=1; s=1"
        assert header(jar, "http://www.example.com/", now=NOW + 100) == "s=1"
        assert header(jar, "http://www.example.com/", now=NOW + 1e9) == "s=1"

    def test_max_age_zero_or_a_past_expires_deletes(self) -> None:
        jar = got(["a=1; Path=/", "b=2; Path=/", "c=3; Path=/"])
        jar = got(["a=; Max-Age=0; Path=/", "b=x; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Path=/",
                   "c=3; Max-Age=0; Path=/other"], old=jar)
        assert [c.name for c in jar] == ["c"]
        assert got(["z=1; Max-Age=0"]) == []  # born expired: nothing kept

    def test_expired_cookies_go_at_the_next_change(self) -> None:
        jar = got(["a=1; Max-Age=10; Path=/"])
        jar = got(["b=2; Path=/"], old=jar, now=NOW + 20)
        assert [c.name for c in jar] == ["b"]

    def test_replacing_a_cookie_keeps_its_creation_time(self) -> None:
        jar = got(["a=1; Path=/", "b=1; Path=/"])
        jar = got(["a=2; Path=/"], old=jar, now=NOW + 50)
        assert {c.name: (c.value, c.created) for c in jar} == {"a": ("2", NOW), "b": ("1", NOW)}
        # Same name, another path or domain: another cookie.
        jar = got(["a=3; Path=/x", "a=4; Domain=example.com; Path=/"], old=jar, now=NOW + 60)
        assert len([c for c in jar if c.name == "a"]) == 3

    def test_an_unchanged_cookie_is_no_change(self) -> None:
        jar = got(["a=1; Max-Age=86400; Path=/"])
        assert ck.receive(jar, ["a=1; Max-Age=86400; Path=/"], host="www.example.com",
                          path="/", now=NOW + 60, suffixes=PSL) is None
        moved = ck.receive(jar, ["a=1; Max-Age=86400; Path=/"], host="www.example.com",
                           path="/", now=NOW + ck.EXPIRY_SLACK + 1, suffixes=PSL)
        assert moved is not None and moved[0].expires == NOW + ck.EXPIRY_SLACK + 1 + 86400
        assert ck.receive(jar, ["a=2; Max-Age=86400; Path=/"], host="www.example.com",
                          path="/", now=NOW + 60, suffixes=PSL) is not None
        assert ck.receive(jar, ["bad line"], host="www.example.com", path="/", now=NOW,
                          suffixes=PSL) is None

    def test_the_header_is_longest_path_first_then_oldest(self) -> None:
        jar = got(["b=1; Path=/"], now=NOW)
        jar = got(["a=1; Path=/"], old=jar, now=NOW + 1)
        jar = got(["c=1; Path=/a/b"], old=jar, now=NOW + 2)
        jar = got(["d=1; Path=/a"], old=jar, now=NOW + 3)
        assert header(jar, "http://www.example.com/a/b/c") == "c=1; d=1; b=1; a=1"


class TestBounds:
    def test_at_most_fifty_cookies_a_site_the_oldest_go(self) -> None:
        jar: list[Cookie] = []
        for i in range(MAX_COOKIES_PER_SITE + 10):
            jar = got([f"c{i}=v; Path=/"], old=jar, now=NOW + i)
        assert len(jar) == MAX_COOKIES_PER_SITE
        assert {c.name for c in jar} == {f"c{i}" for i in range(10, MAX_COOKIES_PER_SITE + 10)}

    def test_a_set_cookie_flood_is_bounded_by_count_and_bytes(self) -> None:
        big = "v" * (MAX_COOKIE_BYTES - 20)
        flood = [f"f{i}={big}; Path=/" for i in range(100)]
        jar = got(flood)
        assert sum(c.size for c in jar) <= MAX_SITE_BYTES
        assert len(jar) == MAX_SITE_BYTES // (len(big) + 40)  # the newest that fit
        assert jar[-1].name == "f99"
        small = got([f"s{i}=1; Path=/" for i in range(1000)])
        assert len(small) == MAX_COOKIES_PER_SITE and small[-1].name == "s999"
        assert len(header(jar, "http://www.example.com/")) <= MAX_SITE_BYTES

    def test_the_fetcher_keeps_whole_lines_within_its_bound(self) -> None:
        assert set_cookie_lines(None) == "" and set_cookie_lines([]) == ""
        assert set_cookie_lines(["a=1", "b=2;\r\n Path=/"]) == "a=1\nb=2;   Path=/"
        too_long = "x=" + "v" * MAX_COOKIE_BYTES
        assert set_cookie_lines(["a=1", too_long, "b=2"]) == "a=1\nb=2"
        kept = set_cookie_lines([f"c{i}=" + "v" * 4000 for i in range(100)])
        lines = kept.split("\n")
        assert len(kept) <= MAX_SET_COOKIE_BYTES and all(len(x) <= MAX_COOKIE_BYTES for x in lines)
        assert lines == [f"c{i}=" + "v" * 4000 for i in range(len(lines))] and len(lines) == 8


class TestJar:
    """crawler.state.cookiestore on real files."""

    def test_cookies_and_session_cookies_survive_a_reopen(self, tmp_path: Path) -> None:
        jar = CookieJar(str(tmp_path))
        u = parse("http://www.example.co.uk/app/login")
        assert jar.receive(u, "sid=abc\nkeep=1; Max-Age=3600; Path=/\nleak=1; Domain=co.uk")
        assert not jar.receive(u, "sid=abc")  # nothing changed: nothing written
        assert not jar.receive(u, "x=1; Domain=co.uk")  # refused
        jar.close()
        again = CookieJar(str(tmp_path))
        assert again.header(parse("http://www.example.co.uk/app/x")) == "sid=abc; keep=1"
        assert again.header(parse("http://other.example.co.uk/")) == ""
        assert again.header(parse("http://other.co.uk/")) == ""
        assert [s for s, _ in again.sites()] == ["example.co.uk"] and len(again) == 1
        again.close()

    def test_a_site_emptied_loses_its_record(self, tmp_path: Path) -> None:
        jar = CookieJar(str(tmp_path))
        u = parse("http://h0.test/")
        assert jar.receive(u, "a=1")
        assert jar.receive(u, "a=; Max-Age=0") and len(jar) == 0
        jar.close()

    def test_the_jar_keeps_at_most_max_sites(self, tmp_path: Path) -> None:
        jar = CookieJar(str(tmp_path), max_sites=5)
        for i in range(20):
            assert jar.receive(parse(f"http://h{i}.test/"), "a=1")
            assert len(jar) <= 5
        assert jar.header(parse("http://h19.test/")) == "a=1"  # the newest is kept
        jar.close()

    def test_a_damaged_record_reads_as_no_cookies(self, tmp_path: Path) -> None:
        jar = CookieJar(str(tmp_path))
        jar.receive(parse("http://h0.test/"), "a=1")
        jar.receive(parse("http://h1.test/"), "b=1")
        jar.close()
        from crawler.state.cookiestore import _key

        with kvstore.open(str(tmp_path / COOKIES_NAME)) as store:
            store[_key("h0.test")] = b"{not json"
            store[_key("h1.test")] = store[_key("h2.test")] = b'{"site":"h9.test","cookies":[]}'
        again = CookieJar(str(tmp_path))
        assert again.header(parse("http://h0.test/")) == ""
        assert again.header(parse("http://h1.test/")) == ""  # another site's record
        assert again.receive(parse("http://h0.test/"), "c=1")  # written anew
        assert again.header(parse("http://h0.test/")) == "c=1"
        again.close()
