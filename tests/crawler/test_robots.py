"""crawler.web.robots: RFC 9309 cases written from the RFC; crawler.run.robotscache; the test
web's robots.txt.

Each ``TestRFC9309...`` case cites the section it comes from. The four cases
that were strict xfails while robots.txt was matched by protego now pass
(crawler.web._robotstxt follows the RFC there); the full table is in
test_robots_rfc9309.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.exceptions import ConfigError
from crawler.run.robotscache import RobotsCache
from crawler.web.robots import (
    DEFAULT_MAX_ROBOTS_BYTES,
    DEFAULT_ROBOTS_RETRY,
    DEFAULT_ROBOTS_TTL,
    DEFAULT_UNREACHABLE_LIMIT,
    RobotsRules,
    product_token,
    robots_key,
    robots_url,
)
from tools.testweb import TestWeb, fault

UA = "KVCrawl/0.1 (+http://127.0.0.1/about)"
NOW = 1_000_000.0
BASE = "http://example.test"


def rules(text: str | bytes, *, user_agent: str = UA, **kw: object) -> RobotsRules:
    body = text.encode() if isinstance(text, str) else text
    return RobotsRules.from_response(200, body, user_agent=user_agent, now=NOW, **kw)  # type: ignore[arg-type]


def allowed(text: str | bytes, path: str, **kw: object) -> bool:
    return rules(text, **kw).can_fetch(BASE + path)


class TestRFC9309Matching:
    """§2.2.2: longest match, Allow on ties, prefixes, case, percent-encoding."""

    def test_longest_match_wins_allow_longer(self) -> None:
        txt = "User-agent: *\nDisallow: /\nAllow: /p\n"
        assert allowed(txt, "/page")
        assert not allowed(txt, "/other")

    def test_longest_match_wins_disallow_longer(self) -> None:
        txt = "User-agent: *\nAllow: /folder\nDisallow: /folder/\n"
        assert not allowed(txt, "/folder/page")
        assert allowed(txt, "/folder")
        assert allowed(txt, "/folderx")

    def test_longest_match_independent_of_order(self) -> None:
        a = "User-agent: *\nAllow: /a/b/\nDisallow: /a/\n"
        b = "User-agent: *\nDisallow: /a/\nAllow: /a/b/\n"
        for txt in (a, b):
            assert allowed(txt, "/a/b/c")
            assert not allowed(txt, "/a/c")

    @pytest.mark.parametrize("order", ["allow_first", "disallow_first"])
    def test_tie_between_allow_and_disallow_goes_to_allow(self, order: str) -> None:
        lines = ["Allow: /page", "Disallow: /page"]
        if order == "disallow_first":
            lines.reverse()
        txt = "User-agent: *\n" + "\n".join(lines) + "\n"
        assert allowed(txt, "/page")
        assert allowed(txt, "/page.html")

    def test_rules_are_prefixes(self) -> None:
        txt = "User-agent: *\nDisallow: /private\n"
        assert not allowed(txt, "/private")
        assert not allowed(txt, "/private/x")
        assert not allowed(txt, "/private-eye.html")
        assert allowed(txt, "/privat")
        assert allowed(txt, "/public/private")

    def test_query_is_part_of_the_match(self) -> None:
        txt = "User-agent: *\nDisallow: /search?\n"
        assert not allowed(txt, "/search?q=1")
        assert allowed(txt, "/search")
        assert allowed(txt, "/search/x")

    def test_no_match_means_allowed(self) -> None:
        assert allowed("User-agent: *\nDisallow: /a\n", "/b")

    def test_paths_are_case_sensitive(self) -> None:
        txt = "User-agent: *\nDisallow: /Private/\n"
        assert not allowed(txt, "/Private/x")
        assert allowed(txt, "/private/x")
        assert allowed(txt, "/PRIVATE/x")

    def test_field_names_are_case_insensitive(self) -> None:
        txt = "USER-AGENT: *\ndIsAlLoW: /a\nALLOW: /a/b\n"
        assert not allowed(txt, "/a")
        assert allowed(txt, "/a/b")

    def test_empty_disallow_allows_everything(self) -> None:
        r = rules("User-agent: *\nDisallow:\n")
        assert r.state == "rules"
        assert r.can_fetch(BASE + "/")
        assert r.can_fetch(BASE + "/anything/at/all?x=1")

    def test_comments_and_blank_lines_ignored(self) -> None:
        txt = "# hi\n\nUser-agent: * # everyone\n\n# between\nDisallow: /a # not /b\n"
        assert not allowed(txt, "/a")
        assert allowed(txt, "/b")

    def test_rules_before_any_user_agent_are_ignored(self) -> None:
        assert allowed("Disallow: /\nUser-agent: *\nDisallow: /x\n", "/a")

    def test_percent_encoded_unreserved_in_rule_matches_plain_uri(self) -> None:
        # RFC 9309 §2.2.2 table: /foo/bar/%62%61%7A matches /foo/bar/baz.
        assert not allowed("User-agent: *\nDisallow: /foo/bar/%62%61%7A\n", "/foo/bar/baz")

    def test_plain_rule_matches_percent_encoded_unreserved_uri(self) -> None:
        assert not allowed("User-agent: *\nDisallow: /foo/baz\n", "/foo/%62%61%7A")

    def test_utf8_rule_matches_percent_encoded_uri(self) -> None:
        # RFC 9309 §2.2.2 table: /foo/bar/U+E38384 is /foo/bar/%E3%83%84.
        assert not allowed("User-agent: *\nDisallow: /foo/bar/\u30c4\n", "/foo/bar/%E3%83%84")
        assert not allowed("User-agent: *\nDisallow: /foo/bar/%E3%83%84\n", "/foo/bar/%E3%83%84")

    def test_percent_escape_hex_case_does_not_matter(self) -> None:
        assert not allowed("User-agent: *\nDisallow: /a%3cb\n", "/a%3Cb")
        assert not allowed("User-agent: *\nDisallow: /a%3Cb\n", "/a%3cb")

    def test_rfc_example_reserved_characters_in_query(self) -> None:
        txt = "User-agent: *\nDisallow: /foo/bar?baz=https://foo.bar\n"
        assert not allowed(txt, "/foo/bar?baz=https%3A%2F%2Ffoo.bar")


class TestRFC9309Wildcards:
    """§2.2.3: ``*`` is any run of characters, ``$`` ends the pattern."""

    def test_star_matches_any_sequence(self) -> None:
        txt = "User-agent: *\nDisallow: /*.php\n"
        assert not allowed(txt, "/index.php")
        assert not allowed(txt, "/a/b/c.php?x=1")
        assert not allowed(txt, "/x.phpy")
        assert allowed(txt, "/index.PHP")
        assert allowed(txt, "/index.html")

    def test_star_in_the_middle(self) -> None:
        txt = "User-agent: *\nDisallow: /s1/*?v=\n"
        assert not allowed(txt, "/s1/p3.html?v=1")
        assert allowed(txt, "/s1/p3.html")
        assert allowed(txt, "/s2/p3.html?v=1")

    def test_trailing_star_is_like_no_star(self) -> None:
        for path in ("/fish", "/fish.html", "/fishheads/x"):
            assert not allowed("User-agent: *\nDisallow: /fish*\n", path)
        assert allowed("User-agent: *\nDisallow: /fish*\n", "/Fish")

    def test_dollar_anchors_the_end(self) -> None:
        txt = "User-agent: *\nDisallow: /*.php$\n"
        assert not allowed(txt, "/index.php")
        assert not allowed(txt, "/a/b.php")
        assert allowed(txt, "/index.php?x=1")
        assert allowed(txt, "/index.php5")

    def test_root_with_dollar_is_only_the_root(self) -> None:
        txt = "User-agent: *\nDisallow: /$\n"
        assert not allowed(txt, "/")
        assert allowed(txt, "/a")

    def test_wildcard_length_counts_for_longest_match(self) -> None:
        # "/*.html" (7 octets) is shorter than "/private/" (9): Disallow wins.
        txt = "User-agent: *\nAllow: /*.html\nDisallow: /private/\n"
        assert not allowed(txt, "/private/a.html")
        assert allowed(txt, "/public/a.html")

    def test_anchored_query_variant(self) -> None:
        txt = "User-agent: *\nDisallow: /s3/*?v=2$\n"
        assert not allowed(txt, "/s3/p1.html?v=2")
        assert allowed(txt, "/s3/p1.html?v=22")
        assert allowed(txt, "/s3/p1.html?v=1")

    def test_dollar_is_only_an_anchor(self) -> None:
        assert allowed("User-agent: *\nDisallow: /a$\n", "/a$x")

    def test_index_html_is_not_the_directory(self) -> None:
        assert not allowed("User-agent: *\nDisallow: /\nAllow: /index.html\n", "/")


class TestRFC9309Groups:
    """§2.2.1: the group for our product token, case-insensitive, ``*`` as fallback."""

    def test_product_token_extracted_from_user_agent(self) -> None:
        assert product_token(UA) == "kvcrawl"
        assert product_token("my_bot-2") == "my_bot-"
        with pytest.raises(ConfigError):
            product_token("/1.0 nothing")

    def test_our_group_beats_star(self) -> None:
        txt = "User-agent: *\nDisallow: /\n\nUser-agent: kvcrawl\nDisallow: /private\n"
        assert allowed(txt, "/public")
        assert not allowed(txt, "/private")

    def test_group_name_case_insensitive(self) -> None:
        assert not allowed("User-agent: KVCRAWL\nDisallow: /a\n", "/a")
        assert not allowed("User-agent: kvCrawl\nDisallow: /a\n", "/a", user_agent="kvcrawl")

    def test_star_is_the_fallback(self) -> None:
        txt = "User-agent: otherbot\nDisallow: /\n\nUser-agent: *\nDisallow: /star\n"
        assert allowed(txt, "/a")
        assert not allowed(txt, "/star")

    def test_no_group_for_us_and_no_star_allows_all(self) -> None:
        assert allowed("User-agent: otherbot\nDisallow: /\n", "/a")

    def test_other_agents_group_does_not_apply(self) -> None:
        txt = "User-agent: badbot\nDisallow: /\n\nUser-agent: *\nDisallow:\n"
        assert allowed(txt, "/s0/p1.html")
        assert not allowed(txt, "/s0/p1.html", user_agent="BadBot/2.0")

    def test_groups_for_the_same_agent_are_merged(self) -> None:
        txt = ("User-agent: kvcrawl\nDisallow: /a\n\nUser-agent: other\nDisallow: /o\n\n"
               "User-agent: KVCrawl\nDisallow: /b\n")
        assert not allowed(txt, "/a")
        assert not allowed(txt, "/b")
        assert allowed(txt, "/o")

    def test_several_user_agent_lines_share_a_group(self) -> None:
        txt = "User-agent: a\nUser-agent: kvcrawl\nUser-agent: b\nDisallow: /x\n"
        assert not allowed(txt, "/x")
        assert not allowed(txt, "/x", user_agent="b")
        assert allowed(txt, "/x", user_agent="c")

    def test_a_user_agent_line_after_rules_starts_a_new_group(self) -> None:
        txt = "User-agent: a\nDisallow: /\nUser-agent: kvcrawl\nDisallow: /b\n"
        assert allowed(txt, "/a")
        assert not allowed(txt, "/b")

    def test_other_records_do_not_split_groups(self) -> None:
        # §2.2.4: records such as Sitemap must not interfere with the groups.
        txt = "User-agent: a\nSitemap: /s.xml\nUser-agent: kvcrawl\nDisallow: /x\n"
        assert not allowed(txt, "/x")

    def test_star_group_ignored_when_ours_exists(self) -> None:
        txt = "User-agent: *\nDisallow: /star\n\nUser-agent: kvcrawl\nAllow: /\n"
        assert allowed(txt, "/star")

    def test_group_name_must_be_the_whole_token(self) -> None:
        assert allowed("User-agent: kv\nDisallow: /\n", "/a")


class TestRFC9309Specials:
    def test_robots_txt_itself_is_always_allowed(self) -> None:
        for r in (rules("User-agent: *\nDisallow: /\n"),
                  RobotsRules.from_response(503, b"", user_agent=UA, now=NOW)):
            assert r.can_fetch(BASE + "/robots.txt")
            assert r.can_fetch("/robots.txt")
            assert not r.can_fetch(BASE + "/robots.txt.bak")
            assert not r.can_fetch(BASE + "/")

    def test_crawl_delay(self) -> None:
        assert rules("User-agent: *\nCrawl-delay: 2.5\n").crawl_delay == 2.5
        assert rules("User-agent: *\ncrawl-delay: 3\nDisallow: /a\n").crawl_delay == 3.0
        assert rules("User-agent: *\nDisallow: /a\n").crawl_delay is None
        assert rules("User-agent: *\nCrawl-delay: soon\n").crawl_delay is None
        assert rules("User-agent: *\nCrawl-delay: -4\n").crawl_delay is None

    def test_crawl_delay_comes_from_our_group(self) -> None:
        # (the empty Disallow ends the "*" group: a blank line would not, RFC 9309 §2.2)
        txt = "User-agent: *\nCrawl-delay: 9\nDisallow:\n\nUser-agent: kvcrawl\nCrawl-delay: 0.5\n"
        assert rules(txt).crawl_delay == 0.5
        assert rules(txt, user_agent="other").crawl_delay == 9.0

    def test_byte_order_mark_is_dropped(self) -> None:
        assert not allowed(b"\xef\xbb\xbfUser-agent: *\nDisallow: /a\n", "/a")

    def test_crlf_and_cr_line_ends(self) -> None:
        assert not allowed("User-agent: *\r\nDisallow: /a\r\n", "/a")
        assert not allowed("User-agent: *\rDisallow: /a\r", "/a")

    def test_invalid_utf8_in_a_rule_is_not_fatal(self) -> None:
        r = rules(b"User-agent: *\nDisallow: /caf\xe9\nDisallow: /b\n")
        assert not r.can_fetch(BASE + "/b")
        assert r.can_fetch(BASE + "/a")


class TestSizeCap:
    def test_rule_after_the_cap_is_not_applied(self) -> None:
        head = b"User-agent: *\nDisallow: /early\n"
        filler = b"# filler filler filler filler\n" * (DEFAULT_MAX_ROBOTS_BYTES // 30 + 10)
        r = rules(head + filler + b"Disallow: /late\n")
        assert r.truncated
        assert r.size <= DEFAULT_MAX_ROBOTS_BYTES
        assert not r.can_fetch(BASE + "/early")
        assert r.can_fetch(BASE + "/late")

    def test_under_the_cap_is_whole(self) -> None:
        body = b"User-agent: *\n" + b"# x\n" * 1000 + b"Disallow: /late\n"
        r = rules(body)
        assert not r.truncated and r.size == len(body)
        assert not r.can_fetch(BASE + "/late")

    def test_a_line_cut_by_the_cap_is_dropped_not_shortened(self) -> None:
        head = b"User-agent: *\nDisallow: /\n"
        line = b"Allow: /public-area\n"
        cap = len(head) + len(b"Allow: /pub")  # the cap falls inside the Allow line
        r = rules(head + line, max_bytes=cap)
        assert r.truncated
        # Shortened to "Allow: /pub" it would allow /pubs; dropped, nothing is allowed.
        assert not r.can_fetch(BASE + "/pubs")
        assert not r.can_fetch(BASE + "/public-area")

    def test_a_cap_without_any_line_end_allows_all(self) -> None:
        r = rules(b"User-agent: * Disallow: /" + b"x" * 100, max_bytes=50)
        assert r.can_fetch(BASE + "/x")


class TestGarbage:
    def test_html_and_binary_junk_allow_all(self) -> None:
        body = b"<html><body>Oops</body></html>\n" + bytes(range(256)) * 8
        r = rules(body)
        assert r.state == "rules"
        assert r.can_fetch(BASE + "/")
        assert r.can_fetch(BASE + "/a/b?c")

    @settings(max_examples=150, deadline=None)
    @given(st.binary(max_size=2000), st.text(max_size=40))
    def test_any_body_and_any_path_never_raise(self, body: bytes, path: str) -> None:
        r = rules(body)
        assert r.state == "rules"
        assert isinstance(r.can_fetch(BASE + "/" + path), bool)
        assert r.can_fetch(BASE + "/robots.txt")

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.sampled_from(["User-agent: *", "User-agent: kvcrawl", "Disallow: /a",
                                     "Allow: /a/b", "Disallow: /*x$", "Crawl-delay: 1",
                                     "Disallow:", "garbage", "\x00", "Allow: $", "Disallow: *"]),
                    max_size=12))
    def test_rule_soup_never_raises(self, lines: list[str]) -> None:
        r = rules("\n".join(lines))
        for path in ("/", "/a", "/a/b", "/zx", "/robots.txt"):
            r.can_fetch(BASE + path)

    def test_unparsable_url_is_not_fetched(self) -> None:
        r = rules("User-agent: *\nDisallow: /a\n")
        assert r.can_fetch("http://[::1/a b") is False  # protego raises ValueError on it


class TestStatus:
    """§2.3.1: what each kind of answer means."""

    @pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 451])
    def test_4xx_allows_all(self, status: int) -> None:
        body = b"User-agent: *\nDisallow: /\n"
        r = RobotsRules.from_response(status, body, user_agent=UA, now=NOW)
        assert r.state == "allow_all"
        assert r.can_fetch(BASE + "/anything")
        assert r.expires_at == NOW + DEFAULT_ROBOTS_TTL
        assert r.retry_at is None and r.failing_since is None

    def test_3xx_final_answer_allows_all(self) -> None:
        # §2.3.1.2: more than five redirects may be taken as "unavailable".
        assert RobotsRules.from_response(301, None, user_agent=UA, now=NOW).state == "allow_all"

    @pytest.mark.parametrize("status", [500, 502, 503, 504, 429, None, 600, 100])
    def test_unreachable_disallows_until_retry(self, status: int | None) -> None:
        r = RobotsRules.from_response(status, b"User-agent: *\nDisallow:\n", user_agent=UA, now=NOW)
        assert r.state == "disallow_all_for_now"
        assert not r.can_fetch(BASE + "/")
        assert not r.can_fetch(BASE + "/a")
        assert r.retry_at == NOW + DEFAULT_ROBOTS_RETRY == r.expires_at
        assert r.failing_since == NOW
        assert r.crawl_delay is None
        assert not r.expired(NOW + DEFAULT_ROBOTS_RETRY - 1)
        assert r.expired(NOW + DEFAULT_ROBOTS_RETRY)

    def test_2xx_expires_after_ttl(self) -> None:
        r = RobotsRules.from_response(200, b"", user_agent=UA, now=NOW, ttl=60)
        assert r.expires_at == NOW + 60 and r.retry_at is None
        assert not r.expired(NOW + 59) and r.expired(NOW + 60)

    def test_long_unreachable_becomes_allow_all(self) -> None:
        prev = None
        t = NOW
        while t - NOW < DEFAULT_UNREACHABLE_LIMIT:
            prev = RobotsRules.from_response(503, None, user_agent=UA, now=t, previous=prev)
            assert prev.state == "disallow_all_for_now" and prev.failing_since == NOW
            t += 86400
        r = RobotsRules.from_response(None, None, user_agent=UA, now=t, previous=prev)
        assert r.state == "allow_all" and r.can_fetch(BASE + "/x")
        assert r.failing_since == NOW
        assert r.retry_at == r.expires_at == t + DEFAULT_ROBOTS_RETRY  # still re-fetched
        again = RobotsRules.from_response(503, None, user_agent=UA, now=t + 600, previous=r)
        assert again.state == "allow_all"
        ok = RobotsRules.from_response(200, b"User-agent: *\nDisallow: /\n", user_agent=UA,
                                       now=t + 1200, previous=again)
        assert ok.state == "rules" and ok.failing_since is None and not ok.can_fetch(BASE + "/x")

    def test_a_success_ends_the_failure_run(self) -> None:
        bad = RobotsRules.from_response(503, None, user_agent=UA, now=NOW)
        good = RobotsRules.from_response(404, None, user_agent=UA, now=NOW + 10, previous=bad)
        bad2 = RobotsRules.from_response(503, None, user_agent=UA, now=NOW + 20, previous=good)
        assert bad2.failing_since == NOW + 20

    def test_allow_all_constructor(self) -> None:
        r = RobotsRules.allow_all(now=NOW)
        assert r.state == "allow_all" and r.can_fetch(BASE + "/x")


class TestKeys:
    def test_robots_key_and_url(self) -> None:
        assert robots_key("HTTP://H0.Test:8080/a/b?c") == "http://h0.test:8080"
        assert robots_key("https://h0.test/x") == "https://h0.test:443"
        assert robots_key("http://h0.test/x") == robots_key("http://h0.test:80/y")
        assert robots_key("http://h0.test/") != robots_key("https://h0.test/")
        assert robots_url("http://h0.test:8080/a/b?c#f") == "http://h0.test:8080/robots.txt"
        assert robots_url("https://u:p@H.test/x") == "https://h.test/robots.txt"


def _rules_at(now: float, *, ttl: float = 100, body: bytes = b"") -> RobotsRules:
    return RobotsRules.from_response(200, body, user_agent=UA, now=now, ttl=ttl)


class TestRobotsCache:
    def test_get_missing_is_none(self) -> None:
        assert RobotsCache().get("http://a:80", NOW) is None

    def test_stored_until_expiry(self) -> None:
        cache = RobotsCache()
        r = _rules_at(NOW, ttl=100)
        cache.finish_fetch("k", r)
        assert cache.get("k", NOW + 99) is r
        assert cache.get("k", NOW + 100) is None
        assert cache.peek("k") is r  # still there for previous=

    def test_lru_eviction_by_count(self) -> None:
        cache = RobotsCache(max_hosts=3)
        for k in "abc":
            cache.finish_fetch(k, _rules_at(NOW))
        assert cache.get("a", NOW) is not None  # a is now the most recently used
        cache.finish_fetch("d", _rules_at(NOW))
        assert len(cache) == 3
        assert cache.peek("b") is None
        assert all(cache.peek(k) is not None for k in "acd")
        assert cache.evictions == 1

    def test_eviction_by_bytes(self) -> None:
        body = b"User-agent: *\n" + b"# pad\n" * 2000
        cache = RobotsCache(max_bytes=3 * len(body))
        for k in "abcd":
            cache.finish_fetch(k, _rules_at(NOW, body=body))
        assert len(cache) == 2 and cache.bytes <= 3 * len(body)
        assert cache.peek("a") is None and cache.peek("d") is not None

    def test_replacing_an_entry_keeps_the_byte_count(self) -> None:
        cache = RobotsCache()
        cache.finish_fetch("a", _rules_at(NOW, body=b"x" * 1000))
        before = cache.bytes
        cache.finish_fetch("a", _rules_at(NOW, body=b"y" * 1000))
        assert cache.bytes == before and len(cache) == 1

    def test_exactly_one_fetcher_and_waiters_see_its_result(self) -> None:
        cache = RobotsCache()
        n = 20
        barrier = threading.Barrier(n)
        claimed: list[int] = []
        seen: list[RobotsRules | None] = []
        lock = threading.Lock()
        result = _rules_at(NOW)

        def worker(i: int) -> None:
            barrier.wait()
            if cache.begin_fetch("h", NOW):
                with lock:
                    claimed.append(i)
                barrier_done.wait()  # everyone else has tried by now
                cache.finish_fetch("h", result)
            else:
                barrier_done.wait()
                assert cache.wait("h", timeout=30)
                with lock:
                    seen.append(cache.get("h", NOW))

        barrier_done = threading.Barrier(n)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(claimed) == 1
        assert seen == [result] * (n - 1)
        assert not cache.fetching("h")

    def test_abort_releases_the_claim(self) -> None:
        cache = RobotsCache()
        assert cache.begin_fetch("h", NOW)
        assert not cache.begin_fetch("h", NOW)
        cache.abort_fetch("h")
        assert cache.wait("h", timeout=0)
        assert cache.get("h", NOW) is None
        assert cache.begin_fetch("h", NOW)

    def test_wait_times_out_while_fetching(self) -> None:
        cache = RobotsCache()
        assert cache.begin_fetch("h", NOW)
        assert cache.wait("h", timeout=0.01) is False
        assert cache.wait("other", timeout=0) is True

    def test_stale_claim_can_be_taken_over(self) -> None:
        cache = RobotsCache(fetch_lease=60)
        assert cache.begin_fetch("h", NOW)
        assert not cache.begin_fetch("h", NOW + 59)
        assert cache.begin_fetch("h", NOW + 60)
        assert not cache.begin_fetch("h", NOW + 61)

    def test_invalid_limits(self) -> None:
        with pytest.raises(ConfigError):
            RobotsCache(max_hosts=0)


# -- the test web's robots.txt, fetched over loopback ----------------------------------


def _fetch_rules(web: TestWeb, host: str) -> RobotsRules:
    with web.session() as session:
        resp = session.get(web.url(host, "/robots.txt"), timeout=30, allow_redirects=False)
    return RobotsRules.from_response(resp.status_code, resp.content, user_agent=UA, now=NOW)


PROBES = ["/", "/s2/p1.html", "/s2/p17.html", "/s2/p2.html", "/s2/", "/s3/p5.html?v=2",
          "/s3/p5.html?v=1", "/s3/p5.html", "/s1/p3.html?v=1", "/s1/p3.html", "/s0/p9.html?v=2"]


def _check_against_site(web: TestWeb, hosts: list[str], extra: Callable[[str], list[str]]) -> int:
    checked = 0
    for host in hosts:
        ours = _fetch_rules(web, host)
        theirs = web.site.robots_rules(host, "kvcrawl")
        for target in PROBES + extra(host):
            assert ours.can_fetch(web.url(host, target)) == theirs.allowed(target), (host, target)
            checked += 1
        assert ours.crawl_delay == theirs.crawl_delay, host
    return checked


class TestTestWeb:
    def test_site_robots_match_the_site_description(
        self, make_testweb: Callable[..., TestWeb]
    ) -> None:
        web = make_testweb(pages=120, hosts=4, seed=3, crawl_delay=0.25)
        every = web.oracle.crawl(obey_robots=False).fetched
        hosts = [f"h{i}.test" for i in range(4)]

        def targets(host: str) -> list[str]:
            prefix = web.url(host, "")
            return [u[len(prefix):] for u in every if u.startswith(prefix + "/")]

        assert _check_against_site(web, hosts, targets) > 100
        # The styles as docs/TESTWEB.md states them, not only as the site computes them.
        h0 = _fetch_rules(web, "h0.test")
        assert h0.can_fetch(web.url("h0.test", "/s2/p1.html"))
        assert not h0.can_fetch(web.url("h0.test", "/s2/p2.html"))
        h1 = _fetch_rules(web, "h1.test")
        assert h1.crawl_delay == 0.25 and not h1.can_fetch(web.url("h1.test", "/s1/p3.html?v=1"))
        h2 = _fetch_rules(web, "h2.test")
        assert h2.state == "allow_all" and h2.status == 404
        h3 = _fetch_rules(web, "h3.test")
        assert h3.state == "rules" and h3.can_fetch(web.url("h3.test", "/s0/p1.html"))

    def test_oracle_blocked_and_fetched_sets_agree(self, testweb: TestWeb) -> None:
        obeying = testweb.oracle.crawl(user_agent="kvcrawl")
        assert obeying.blocked, "the small site should block something"
        by_host: dict[str, RobotsRules] = {}

        def ours(url: str) -> RobotsRules:
            host = url.split("/")[2].split(":")[0]
            if host not in by_host:
                by_host[host] = _fetch_rules(testweb, host)
            return by_host[host]

        for url in obeying.blocked:
            assert not ours(url).can_fetch(url), url
        for url in obeying.fetched:
            assert ours(url).can_fetch(url), url

    def test_hostile_robots(self, make_testweb: Callable[..., TestWeb]) -> None:
        web = make_testweb(pages=20, hosts=2, faults=[
            fault("robots_5xx"), fault("robots_huge"), fault("robots_garbage")])
        r5 = _fetch_rules(web, "robots5xx.test")
        assert r5.state == "disallow_all_for_now" and r5.status == 503
        assert not r5.can_fetch(web.url("robots5xx.test", "/e/1.html"))
        huge = _fetch_rules(web, "robotshuge.test")
        assert huge.truncated and huge.size <= DEFAULT_MAX_ROBOTS_BYTES
        assert not huge.can_fetch(web.url("robotshuge.test", "/e/2.html"))
        assert huge.can_fetch(web.url("robotshuge.test", "/e/1.html"))
        junk = _fetch_rules(web, "robotsgarbage.test")
        assert junk.state == "rules" and junk.can_fetch(web.url("robotsgarbage.test", "/e/2.html"))
        for host in ("robots5xx.test", "robotshuge.test", "robotsgarbage.test"):
            theirs = web.site.robots_rules(host, "kvcrawl")
            ours = _fetch_rules(web, host)
            for target in ("/", "/e/1.html", "/e/2.html"):
                assert ours.can_fetch(web.url(host, target)) == theirs.allowed(target), host
