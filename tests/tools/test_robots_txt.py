"""robots.txt texts of the site and the RFC 9309 matcher the oracle uses; URL normalization."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.testweb.graph import Graph, SiteConfig
from tools.testweb.robots import base_robots, parse
from tools.testweb.site import Site
from tools.testweb.urls import normalize


class TestMatcher:
    def test_longest_match_wins(self) -> None:
        r = parse("User-agent: *\nDisallow: /a/\nAllow: /a/b\n")
        assert not r.allowed("/a/x")
        assert r.allowed("/a/b")
        assert r.allowed("/a/bc/d")
        assert r.allowed("/z")

    def test_allow_wins_a_tie(self) -> None:
        r = parse("User-agent: *\nDisallow: /page\nAllow: /page\n")
        assert r.allowed("/page")

    def test_wildcard_and_anchor(self) -> None:
        r = parse("User-agent: *\nDisallow: /*.pdf$\nDisallow: /s1/*?v=\n")
        assert not r.allowed("/docs/x.pdf")
        assert r.allowed("/docs/x.pdf?download=1")
        assert not r.allowed("/s1/p3.html?v=2")
        assert r.allowed("/s1/p3.html")

    def test_group_selection(self) -> None:
        text = "User-agent: badbot\nDisallow: /\n\nUser-agent: *\nDisallow: /private\n"
        assert parse(text).allowed("/x")
        assert not parse(text, "BadBot").allowed("/x")
        assert not parse(text).allowed("/private/1")

    def test_grouped_agents_share_rules(self) -> None:
        text = "User-agent: a\nUser-agent: b\nDisallow: /x\n"
        assert not parse(text, "a").allowed("/x") and not parse(text, "b").allowed("/x")
        assert parse(text).allowed("/x")  # no '*' group: everything allowed

    def test_empty_disallow_and_comments(self) -> None:
        r = parse("# hi\nUser-agent: * # all\nDisallow:   # nothing\nCrawl-delay: 2.5\n")
        assert r.allowed("/anything") and r.crawl_delay == 2.5

    def test_percent_escapes_compare_case_insensitively(self) -> None:
        assert not parse("User-agent: *\nDisallow: /caf%c3%a9\n").allowed("/caf%C3%A9")

    @given(st.binary(max_size=300))
    def test_garbage_never_raises(self, data: bytes) -> None:
        parse(data.decode("latin-1")).allowed("/x")


@pytest.fixture(scope="module")
def site() -> Site:
    """One site shared by TestSiteRobots."""
    return Site(Graph(SiteConfig(pages=100, hosts=8, crawl_delay=0.5)),
                http_port=8080, https_port=8443)


class TestSiteRobots:
    def test_four_styles(self, site: Site) -> None:
        h0 = site.robots_rules("h0.test")
        assert not h0.allowed("/s2/p2.html") and h0.allowed("/s2/p17.html")
        assert not h0.allowed("/s3/p9.html?v=2") and h0.allowed("/s3/p9.html?v=1")
        assert site.robots_rules("h1.test").crawl_delay == 0.5
        assert not site.robots_rules("h1.test").allowed("/s1/p5.html?v=1")
        assert site.lookup("h2.test", "/robots.txt").status == 404
        assert site.robots_rules("h3.test").allowed("/")
        assert not site.robots_rules("h3.test", "badbot").allowed("/")
        assert base_robots(4, 1.0) == base_robots(0, 1.0)

    def test_home_pages_always_allowed(self, site: Site) -> None:
        for i in range(8):
            assert site.robots_rules(f"h{i}.test").allowed("/")

    def test_integer_crawl_delay_written_as_integer(self) -> None:
        assert "Crawl-delay: 1\n" in (base_robots(1, 1.0) or "")


class TestNormalize:
    @pytest.mark.parametrize(
        ("url", "want"),
        [
            ("HTTP://H0.Test:80/a#x", "http://h0.test/a"),
            ("https://h0.test:443", "https://h0.test/"),
            ("http://h0.test:8080/a b?q=é", "http://h0.test:8080/a%20b?q=%C3%A9"),
            ("http://bücher.test/", "http://xn--bcher-kva.test/"),
            ("http://h0.test/%c3%a9", "http://h0.test/%C3%A9"),
            ("mailto:a@b.test", None),
            ("javascript:void(0)", None),
            ("ftp://h0.test/", None),
            ("http://h0.test:99999/", None),
            ("http:///nohost", None),
        ],
    )
    def test_cases(self, url: str, want: str | None) -> None:
        assert normalize(url) == want

    def test_relative_with_base(self) -> None:
        assert normalize("../b/c.html#f", "http://h.test:81/a/x/y.html") == \
            "http://h.test:81/a/b/c.html"

    @given(st.text(max_size=30))
    def test_idempotent(self, path: str) -> None:
        once = normalize("http://h0.test/" + path)
        if once is not None:
            assert normalize(once) == once


def test_matcher_agrees_with_protego_on_every_url_of_a_site() -> None:
    """protego is what the crawler uses: the oracle must block exactly what it blocks."""
    from protego import Protego

    from tools.testweb import Oracle, hostile

    site = Site(Graph(SiteConfig(pages=300, hosts=8, seed=3)),
                hostile(exclude=["spider_trap"]), http_port=8080, https_port=8443)
    urls = Oracle(site).crawl(obey_robots=False).fetched
    parsers: dict[str, Protego] = {}
    checked = 0
    for url in urls:
        host, target = site.served_by(url)  # type: ignore[misc]
        node = site.lookup(host.name, "/robots.txt")
        if node.status != 200 or node.body is None:
            continue
        if host.name not in parsers:
            parsers[host.name] = Protego.parse(node.body.decode("utf-8", "replace"))
        for agent in ("testcrawler", "badbot"):
            mine = site.robots_rules(host.name, agent)
            assert parsers[host.name].can_fetch(url, agent) == mine.allowed(target), (url, agent)
            assert parsers[host.name].crawl_delay(agent) == mine.crawl_delay
        checked += 1
    assert checked > 100
