"""The ``sitemaps`` feature: what each file serves (lxml, gzip, a stream cut by the
client), and the oracle's sitemap rules (modes, nesting, budget, origins, depth,
scope, robots), checked against the served bytes by the plain live crawler."""

from __future__ import annotations

import time
import tracemalloc
import zlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import lxml.html
import pytest
import requests
from lxml import etree
from protego import Protego
from testweb_helpers import crawl_live, plain_normalize

from tools.testweb import KINDS, Oracle, SiteConfig, TestWeb, fault, hostile
from tools.testweb import oracle as oracle_module
from tools.testweb.graph import Graph
from tools.testweb.model import Node
from tools.testweb.robots import RobotsRules, parse
from tools.testweb.site import Site
from tools.testweb.sitemapped import BOMB_PADDING, HUGE_SIZE, NS, ONLY, PAD_COMMENT
from tools.testweb.urls import REFUSED_IP

TIMEOUT = 5.0
MIB = 1 << 20
X = "{" + NS + "}"  # lxml's namespaced tag prefix
CONFIG = SiteConfig(pages=20, hosts=3, seed=3)
FEATURE_HOSTS = ("h0.test", "h2.test")  # h0: its own robots rules; h2: HTTPS, no robots.txt
FAULTS = [fault("sitemaps"), fault("sitemaps", host="h2.test")]
OTHER = "h1.test"  # the "other host" of both feature hosts (it has no feature)
# In the order a crawler requests them (first in, first out), with their nesting level.
REQUESTED = [
    ("index.xml", 0), ("plain.txt", 0), ("lower.xml", 0), ("/sitemap.xml", 0),
    ("urlset.xml.gz", 1), ("nested.xml", 1), ("bomb.xml.gz", 1), ("huge.xml", 1),
    ("garbage.xml", 1), ("offhost.xml", 1), ("notasitemap.xml", 1), ("missing.xml", 1),
    ("moved.xml", 1), ("away.xml", 1), ("deep.xml", 2), ("deeper.xml", 2), ("moved-to.xml", 1),
]
NEVER_REQUESTED = ["toodeep.xml", "foreign.xml", "away-to.xml"]
# Sitemap-only pages each file gives (its only/<name>.html), and those nothing gives.
GIVES = {
    "/sitemap.xml": ["root-1", "root-2"], "lower.xml": ["lower"], "plain.txt": ["text-1", "text-2"],
    "urlset.xml.gz": ["gz-1", "gz-2"], "deep.xml": ["deep"], "huge.xml": ["huge-1", "huge-2"],
    "garbage.xml": ["garbage-a"], "offhost.xml": ["offhost"], "moved-to.xml": ["moved"],
}
NEVER = ["toodeep", "bomb", "garbage-b", "notasitemap", "offhost-other-1", "offhost-other-2",
         "offhost-scheme", "foreign", "away"]
# Fast knobs for a whole hostile web (as in test_faults.py).
FAST = {
    "slow_first_byte": {"delay": 0.2}, "slow_drip": {"interval": 0.001, "size": 20},
    "huge_body": {"size": 4 * MIB}, "gzip_bomb": {"size": 4 * MIB}, "dns_slow": {"delay": 0.2},
    "robots_slow": {"delay": 0.2}, "robots_huge": {"size": 300_000},
    "malformed": {"depth": 300},
}
# Every answer of h1 a fault (robots.txt excepted, as for any prefix).
ALL_500 = fault("status_500", host="h1.test", prefix="/")


def sm(site: Site | TestWeb, host: str, name: str) -> str:
    """The URL of sitemap ``name`` (under the mount, or an absolute path) on ``host``."""
    return site.url(host, name if name.startswith("/") else "/x/sitemaps/" + name)


def only(site: Site | TestWeb, host: str, names: list[str]) -> set[str]:
    return {site.url(host, f"/x/sitemaps/only/{n}.html") for n in names}


def given(site: Site | TestWeb, host: str, files: list[str] | None = None) -> set[str]:
    """The sitemap-only pages ``files`` (default: every requested one) admit on ``host``."""
    return {u for f, names in GIVES.items() if files is None or f in files
            for u in only(site, host, names)}


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    with TestWeb(CONFIG, faults=FAULTS) as w:
        yield w


@pytest.fixture
def http(web: TestWeb) -> Iterator[requests.Session]:
    web.reset()
    with web.session() as s:
        yield s


def get(http: requests.Session, url: str, **kw: object) -> requests.Response:
    return http.get(url, timeout=TIMEOUT, allow_redirects=False, **kw)  # type: ignore[arg-type]


def ctype(r: requests.Response) -> str:
    return r.headers.get("Content-Type", "").split(";")[0]


def is_padding(data: bytes) -> bool:
    """Whether ``data`` is only spaces, newlines and empty comments."""
    return not data.replace(PAD_COMMENT, b"").strip(b" \n")


def xml_entries(body: bytes) -> tuple[str, list[tuple[str, str]]]:
    """(root tag, [(loc, lastmod or "")]) of a whole, well-formed sitemap."""
    root = etree.fromstring(body)
    out = []
    for item in root:
        lastmod = item.find(X + "lastmod")
        out.append((item.findtext(X + "loc"), "" if lastmod is None else lastmod.text))
    return root.tag.removeprefix(X), out


def strict_locs(body: bytes) -> tuple[list[str], bool]:
    """The <loc>s a non-recovering parser reads, and whether it stopped at an error."""
    parser = etree.XMLPullParser(events=("end",))
    failed = False
    try:
        parser.feed(body)
        parser.close()
    except etree.XMLSyntaxError:
        failed = True
    return [el.text for _, el in parser.read_events() if el.tag == X + "loc"], failed


def hrefs(body: bytes, url: str) -> set[str]:
    doc = lxml.html.document_fromstring(body)
    found = (plain_normalize(a.get("href"), url) for a in doc.iter("a") if a.get("href"))
    return {u for u in found if u is not None}


def node_of(web: TestWeb | Site, url: str):  # type: ignore[no-untyped-def]
    oracle = web.oracle if isinstance(web, TestWeb) else Oracle(web)
    node = oracle.describe(url)
    assert node is not None
    return node


class TestServedFiles:
    @pytest.mark.parametrize("host", FEATURE_HOSTS)
    def test_robots_txt_lines(self, web: TestWeb, http: requests.Session, host: str) -> None:
        r = get(http, web.url(host, "/robots.txt"))
        assert r.status_code == 200 and ctype(r) == "text/plain"
        lines = [line.split(":", 1) for line in r.text.splitlines()
                 if line.lower().startswith("sitemap:")]
        assert [(k, v.strip()) for k, v in lines] == [
            ("Sitemap", sm(web, host, "index.xml")),
            ("Sitemap", "/x/sitemaps/plain.txt"),  # relative
            ("Sitemap", sm(web, OTHER, "foreign.xml")),  # another host
            ("sitemap", sm(web, host, "lower.xml")),  # lower case
        ]
        assert list(Protego.parse(r.text).sitemaps) == [v.strip() for _, v in lines]
        assert web.site.robots_sitemaps(host) == (
            sm(web, host, "index.xml"), sm(web, host, "plain.txt"), sm(web, OTHER, "foreign.xml"),
            sm(web, host, "lower.xml"))
        if host == "h0.test":  # its own rules are kept
            assert "Disallow: /s2/" in r.text
            assert not web.site.robots_rules(host).allowed("/s2/p2.html")
        else:  # it had no robots.txt: one with the lines only
            assert "user-agent" not in r.text.lower()
            assert web.site.robots_rules(host).allowed("/s2/p2.html")

    def test_root_sitemap_is_a_urlset_with_lastmods(self, web: TestWeb,
                                                    http: requests.Session) -> None:
        url = web.url("h0.test", "/sitemap.xml")
        r = get(http, url)
        assert r.status_code == 200 and ctype(r) == "application/xml"
        tag, entries = xml_entries(r.content)
        assert tag == "urlset"
        linked = sm(web, "h0.test", "linked.html")
        assert entries == [(sm(web, "h0.test", "only/root-1.html"), "2024-01-01"),
                           (sm(web, "h0.test", "only/root-2.html"), "2024-01-02T12:00:00+00:00"),
                           (linked, "2024-01-03")]
        assert list(node_of(web, url).sitemap_urls) == entries
        # The one listed page that links reach too: /x/ -> /x/sitemaps/ -> linked.html.
        hub = web.url("h0.test", "/x/")
        assert sm(web, "h0.test", "") in hrefs(get(http, hub).content, hub)
        page = get(http, sm(web, "h0.test", ""))
        assert ctype(page) == "text/html" and hrefs(page.content, page.url) == {linked}
        assert get(http, linked).status_code == 200

    def test_index_lists_its_children(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "index.xml")
        r = get(http, url)
        tag, entries = xml_entries(r.content)
        kids = [sm(web, "h0.test", n) for n in
                ["index.xml", "urlset.xml.gz", "nested.xml", "bomb.xml.gz", "huge.xml",
                 "garbage.xml", "offhost.xml", "notasitemap.xml", "missing.xml", "moved.xml",
                 "away.xml"]] + [sm(web, OTHER, "foreign.xml")]
        assert tag == "sitemapindex" and [loc for loc, _ in entries] == kids
        assert list(node_of(web, url).sitemap_children) == kids
        assert get(http, sm(web, "h0.test", "missing.xml")).status_code == 404
        moved = get(http, sm(web, "h0.test", "moved.xml"))
        assert moved.status_code == 301 and moved.headers["Location"] == "moved-to.xml"
        away = get(http, sm(web, "h0.test", "away.xml"))
        assert away.status_code == 302
        assert away.headers["Location"] == sm(web, OTHER, "away-to.xml")

    def test_gzipped_urlset(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "urlset.xml.gz")
        r = get(http, url)
        assert ctype(r) == "application/gzip" and "Content-Encoding" not in r.headers
        assert r.content[:2] == b"\x1f\x8b"  # requests left it alone: no Content-Encoding
        tag, entries = xml_entries(zlib.decompress(r.content, wbits=47))
        assert tag == "urlset"
        assert entries == [(sm(web, "h0.test", "only/gz-1.html"), "2024-03-01"),
                           (sm(web, "h0.test", "only/gz-2.html"), "")]
        assert list(node_of(web, url).sitemap_urls) == entries

    def test_nested_indexes(self, web: TestWeb, http: requests.Session) -> None:
        def parsed(name: str) -> tuple[str, list[str]]:
            tag, entries = xml_entries(get(http, sm(web, "h0.test", name)).content)
            return tag, [loc for loc, _ in entries]

        assert parsed("nested.xml") == ("sitemapindex", [sm(web, "h0.test", "deep.xml"),
                                                         sm(web, "h0.test", "deeper.xml")])
        assert parsed("deeper.xml") == ("sitemapindex", [sm(web, "h0.test", "toodeep.xml")])
        assert parsed("deep.xml") == ("urlset", [sm(web, "h0.test", "only/deep.html")])
        assert parsed("toodeep.xml") == ("urlset", [sm(web, "h0.test", "only/toodeep.html")])

    def test_bomb_hides_its_entry_past_100_mib(self, web: TestWeb,
                                               http: requests.Session) -> None:
        url = sm(web, "h0.test", "bomb.xml.gz")
        r = get(http, url)
        assert r.status_code == 200 and ctype(r) == "application/gzip"
        assert "Content-Encoding" not in r.headers and len(r.content) < MIB
        # Decoded 1 MiB at a time: the head, padding only, then the one <url>.
        d = zlib.decompressobj(wbits=47)
        first = d.decompress(r.content, 4096)
        head = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}">\n'.encode()
        assert first.startswith(head)
        pos, carry, tail = len(head), first[len(head):], b""  # pos: where <url> starts
        rest = d.unconsumed_tail
        parser = etree.XMLPullParser()
        parser.feed(first)
        while rest or not d.eof:
            out = d.decompress(rest, MIB)
            rest = d.unconsumed_tail
            if tail:
                tail += out
                continue
            if pos < 21 * MIB:  # lxml (no huge_tree) reads past the 20 MiB limit, no error
                parser.feed(out)
            data = carry + out
            at = data.find(b"<url>")
            if at >= 0:
                assert is_padding(data[:at])
                pos, tail = pos + at, data[at:]
                continue
            cut = data.rfind(PAD_COMMENT) + len(PAD_COMMENT)  # whole blocks only
            # A comment in every MiB: no run of spaces a parser takes for a huge text node.
            assert cut > 0 or len(data) < MIB
            assert is_padding(data[:cut])
            pos, carry = pos + cut, data[cut:]
        assert pos >= 100_000_000 and pos >= BOMB_PADDING
        assert tail.strip() == (f"<url><loc>{sm(web, 'h0.test', 'only/bomb.html')}</loc></url>\n"
                                "</urlset>").encode()
        node = node_of(web, url)
        assert node.sitemap_urls == () and node.body is None  # built on first request only

    def test_huge_streams_and_the_client_cuts_it(self, web: TestWeb,
                                                 http: requests.Session) -> None:
        url = sm(web, "h0.test", "huge.xml")
        tracemalloc.start()
        try:
            r = http.get(url, timeout=TIMEOUT, stream=True)
            assert r.status_code == 200 and ctype(r) == "application/xml"
            assert int(r.headers["Content-Length"]) == HUGE_SIZE
            chunks, read = [], 0
            for chunk in r.iter_content(64 * 1024):
                chunks.append(chunk)
                read += len(chunk)
                if read > 10 * MIB:  # the crawler's limit on the wire
                    break
            r.close()
            data = b"".join(chunks)
            del chunks
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        head = data[: data.rindex(b"</url>\n") + 7]
        pad = data[len(head) : data.rindex(PAD_COMMENT)]  # whole blocks only
        assert len(pad) > 10 * MIB - 8192 and is_padding(pad)
        assert max(len(run) for run in pad.split(PAD_COMMENT)) < 64 * 1024  # small text nodes
        parser = etree.XMLPullParser()  # lxml without huge_tree reads the 10 MiB, no error
        for i in range(0, len(data), MIB):
            parser.feed(data[i : i + MIB])
        locs, failed = strict_locs(head)
        assert locs == [sm(web, "h0.test", "only/huge-1.html"),
                        sm(web, "h0.test", "only/huge-2.html")]
        assert head.index(b"huge-2") < 1024
        assert list(node_of(web, url).sitemap_urls) == [(locs[0], "2024-04-01"), (locs[1], "")]
        assert peak < 64 * MIB, peak  # nobody (server or client) held the GiB
        # The server stops when the client goes away: it never sends the whole GiB.
        deadline = time.monotonic() + 30
        while web.log.records(path="/x/sitemaps/huge.xml")[0].outcome != "aborted":
            assert time.monotonic() < deadline, "the server kept streaming huge.xml"
            time.sleep(0.01)
        assert web.log.records(path="/x/sitemaps/huge.xml")[0].bytes < HUGE_SIZE

    def test_garbage_stops_a_strict_parser(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "garbage.xml")
        body = get(http, url).content
        a, b = sm(web, "h0.test", "only/garbage-a.html"), sm(web, "h0.test", "only/garbage-b.html")
        assert strict_locs(body) == ([a], True)
        assert body.index(b"<<<") < body.index(b.encode())
        recovered = etree.fromstring(body, etree.XMLParser(recover=True))
        assert [e.text for e in recovered.iter(X + "loc")] == [a, b]  # the trap is real
        assert node_of(web, url).sitemap_urls == ((a, ""),)

    def test_offhost_entries(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "offhost.xml")
        _, entries = xml_entries(get(http, url).content)
        other_scheme = f"https://h0.test:{web.https_port}/x/sitemaps/only/offhost-scheme.html"
        assert [loc for loc, _ in entries] == [
            *sorted(only(web, OTHER, ["offhost-other-1", "offhost-other-2"])), other_scheme,
            sm(web, "h0.test", "only/offhost.html")]
        assert [e for e, _ in node_of(web, url).sitemap_urls] == [loc for loc, _ in entries]

    def test_plain_text_sitemap(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "plain.txt")
        r = get(http, url)
        assert ctype(r) == "text/plain"
        one, two = sm(web, "h0.test", "only/text-1.html"), sm(web, "h0.test", "only/text-2.html")
        lines = r.text.split("\n")
        assert lines[:3] == [one, two, ""] and lines[3].startswith("junk:")
        assert urlsplit(lines[3]).scheme == "junk"  # not http(s), however it is resolved
        assert node_of(web, url).sitemap_urls == ((one, ""), (two, ""))

    def test_not_a_sitemap_and_lower(self, web: TestWeb, http: requests.Session) -> None:
        url = sm(web, "h0.test", "notasitemap.xml")
        r = get(http, url)
        assert ctype(r) == "text/html"
        assert hrefs(r.content, url) == only(web, "h0.test", ["notasitemap"])
        node = node_of(web, url)
        assert node.sitemap_urls == () and node.sitemap_children == ()
        lower = get(http, sm(web, "h0.test", "lower.xml"))
        assert ctype(lower) == "text/xml"
        assert xml_entries(lower.content) == (
            "urlset", [(sm(web, "h0.test", "only/lower.html"), "2024-02-01")])

    def test_foreign_files_exist_only_on_feature_hosts(self, web: TestWeb,
                                                       http: requests.Session) -> None:
        r = get(http, sm(web, "h2.test", "foreign.xml"))
        assert xml_entries(r.content)[1] == [(sm(web, "h2.test", "only/foreign.html"), "")]
        assert get(http, sm(web, "h2.test", "away-to.xml")).status_code == 200
        for name in ("foreign.xml", "away-to.xml", "only/foreign.html", ""):
            assert get(http, sm(web, OTHER, name)).status_code == 404

    def test_only_pages_are_distinct_leaves_nothing_links(self, web: TestWeb,
                                                         http: requests.Session) -> None:
        names = {n for ns in GIVES.values() for n in ns} | set(NEVER)
        assert {f"only/{n}.html" for n in names} == set(ONLY)
        assert sum(len(ns) for ns in GIVES.values()) + len(NEVER) == len(names)  # distinct
        for url in only(web, "h0.test", sorted(names - {"offhost-other-1", "offhost-other-2"})):
            r = get(http, url)
            assert r.status_code == 200 and ctype(r) == "text/html"
            assert hrefs(r.content, url) == set()
        # No page links any of them, nor any sitemap file.
        for obey in (True, False):
            plain = web.oracle.crawl(sitemaps="off", obey_robots=obey)
            assert not any("/x/sitemaps/only/" in u for u in plain.fetched)
            full = web.oracle.crawl(obey_robots=obey)
            assert not full.sitemaps & full.fetched
        for name in ("nope.xml", "only/nope.html", "only/", "index.xml/x"):
            assert get(http, sm(web, "h0.test", name)).status_code == 404


@pytest.fixture(scope="module")
def hostile_web() -> Iterator[TestWeb]:
    with TestWeb(SiteConfig(pages=20, hosts=3, seed=4),
                 faults=(*hostile(**FAST), ALL_500)) as w:  # type: ignore[arg-type]
        yield w


def test_sitemap_xml_on_every_kind_of_host(hostile_web: TestWeb) -> None:
    """A 404 wherever the feature is not (the extra hosts of host faults too), the
    fault's answer on a host whose every answer is a fault, served as described."""
    site = hostile_web.site
    assert {k.extra_host for k in KINDS.values() if k.extra_host} <= set(site.hosts)
    with hostile_web.session() as http:
        for h in site.hosts.values():
            node = site.lookup(h.name, "/sitemap.xml")
            want = {"h0.test": 200, "h1.test": 500}.get(h.name, 404)
            assert node.status == want, h.name
            if h.ip == REFUSED_IP or h.bad_cert or h.dns == "nxdomain":
                continue  # no answer over the network (the server would say the same)
            r = get(http, site.url(h.name, "/sitemap.xml"))
            assert r.status_code == want, h.name
    assert site.lookup("h1.test", "/robots.txt").status == 200  # robots.txt is never hit
    want = hostile_web.oracle.crawl(max_depth=4)
    assert want.sitemap_entries[site.url("h1.test", "/sitemap.xml")] == ()


class TestEveryHost:
    def test_every_contacted_host_of_a_default_site(self) -> None:
        site = Site(Graph(SiteConfig()), http_port=8080, https_port=8443)
        for obey in (True, False):
            res = Oracle(site).crawl(obey_robots=obey)
            contacted = {urlsplit(u).hostname for u in res.fetched | res.blocked}
            assert contacted == set(site.hosts)
            assert res.sitemaps == {site.url(h, "/sitemap.xml") for h in contacted}
            assert res.sitemaps <= res.requests
            assert all(e == () for e in res.sitemap_entries.values())
            assert res.fetched == Oracle(site).crawl(obey_robots=obey, sitemaps="off").fetched

    def test_every_reachable_host_of_a_hostile_site(self) -> None:
        site = Site(Graph(SiteConfig(pages=40, hosts=3, seed=2)), (*hostile(**FAST), ALL_500),
                    http_port=8080, https_port=8443)
        for obey in (True, False):
            res = Oracle(site).crawl(obey_robots=obey, max_depth=4)
            contacted = {urlsplit(u).hostname for u in res.fetched | res.blocked}
            assert contacted == {h.name for h in site.hosts.values() if h.reachable}
            want = {site.url(h, "/sitemap.xml") for h in contacted
                    if not obey or site.robots_rules(h).allowed("/sitemap.xml")}
            assert {u for u in res.sitemaps if u.endswith("/sitemap.xml")} == want
            assert (site.url("robots5xx.test", "/sitemap.xml") in res.sitemaps) == (not obey)
            assert site.url("refused.test", "/sitemap.xml") not in res.requests


def oracle_site(faults: list | None = None,  # type: ignore[type-arg]
                robots: dict[str, str] | None = None) -> Site:
    """The feature's site without a server; ``robots`` adds rules to hosts' robots.txt."""

    class RobotsSite(Site):
        def robots_rules(self, host: str, user_agent: str = "*") -> RobotsRules:
            if robots and host in robots:
                return parse(robots[host], user_agent)
            return super().robots_rules(host, user_agent)

    return RobotsSite(Graph(CONFIG), FAULTS if faults is None else faults, http_port=8080,
                      https_port=8443)


@pytest.fixture(scope="module")
def site() -> Site:
    return oracle_site()


def requested(site: Site, host: str, upto: int | None = None) -> set[str]:
    return {sm(site, host, n) for n, _ in REQUESTED[:upto]}


class TestOracle:
    def test_limits_are_the_crawlers(self) -> None:
        assert oracle_module.MAX_SITEMAPS_PER_HOST == 64
        assert oracle_module.MAX_SITEMAP_NESTING == 2

    def test_all_requests_robots_lines_and_sitemap_xml(self, site: Site) -> None:
        res = Oracle(site).crawl()
        assert res.sitemaps == requested(site, "h0.test") | requested(site, "h2.test") | {
            site.url(OTHER, "/sitemap.xml")}
        for host in FEATURE_HOSTS:
            for name, level in REQUESTED:
                assert res.sitemap_levels[sm(site, host, name)] == level
            for name in NEVER_REQUESTED:
                assert sm(site, host, name) not in res.requests
        assert res.sitemaps <= res.requests and not res.sitemaps & res.fetched
        assert given(site, "h0.test") | given(site, "h2.test") <= res.fetched
        assert not (only(site, "h0.test", NEVER) | only(site, "h2.test", NEVER)) & res.requests

    def test_robots_mode_reads_only_the_lines(self, site: Site) -> None:
        res = Oracle(site).crawl(sitemaps="robots")
        want = requested(site, "h0.test") | requested(site, "h2.test")
        want -= {site.url(h, "/sitemap.xml") for h in FEATURE_HOSTS}
        # h1's robots.txt (the Crawl-delay style) has "Sitemap: /sitemap.xml" of its own.
        assert res.sitemaps == want | {site.url(OTHER, "/sitemap.xml")}
        assert given(site, "h0.test") - res.fetched == given(site, "h0.test", ["/sitemap.xml"])

    def test_off_and_bad_modes(self, site: Site) -> None:
        o = Oracle(site)
        off = o.crawl(sitemaps="off")
        assert off.sitemaps == frozenset() and off.sitemap_entries == {}
        assert not any("/x/sitemaps/only/" in u or u.endswith("/sitemap.xml")
                       for u in off.requests)
        assert off.fetched == o.crawl().fetched - o.sitemap_only()
        with pytest.raises(ValueError, match="sitemaps must be"):
            o.crawl(sitemaps="on")

    def test_ignoring_robots_only_sitemap_xml(self, site: Site) -> None:
        o = Oracle(site)
        res = o.crawl(obey_robots=False)
        assert res.sitemaps == {site.url(h, "/sitemap.xml") for h in site.hosts}
        assert res.robots == frozenset()
        assert o.sitemap_only(obey_robots=False) == only(site, "h0.test", ["root-1", "root-2"]) \
            | only(site, "h2.test", ["root-1", "root-2"])
        assert o.crawl(obey_robots=False, sitemaps="robots").sitemaps == frozenset()

    def test_nesting(self, site: Site) -> None:
        o = Oracle(site)
        deep, toodeep = only(site, "h0.test", ["deep"]), only(site, "h0.test", ["toodeep"])
        res = o.crawl()
        assert deep <= res.fetched and not toodeep & res.fetched
        assert res.sitemap_children[sm(site, "h0.test", "deeper.xml")] == (
            sm(site, "h0.test", "toodeep.xml"),)
        one = o.crawl(max_sitemap_nesting=1)
        assert sm(site, "h0.test", "nested.xml") in one.sitemaps
        assert sm(site, "h0.test", "deep.xml") not in one.sitemaps and not deep & one.fetched
        three = o.crawl(max_sitemap_nesting=3)  # toodeep.xml is a sitemap like the others
        assert three.sitemap_levels[sm(site, "h0.test", "toodeep.xml")] == 3
        assert toodeep <= three.fetched

    @pytest.mark.parametrize("budget", [1, 5, 13, 16])
    def test_budget_per_host_in_request_order(self, site: Site, budget: int) -> None:
        res = Oracle(site).crawl(max_sitemaps_per_host=budget)
        assert res.sitemaps == requested(site, "h0.test", budget) | \
            requested(site, "h2.test", budget) | {site.url(OTHER, "/sitemap.xml")}
        moved = only(site, "h0.test", ["moved"])
        # moved.xml (13th) counts; its target would be the 17th.
        assert not moved & res.fetched

    def test_budget_constant_is_read_at_call_time(self, site: Site,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(oracle_module, "MAX_SITEMAPS_PER_HOST", 5)
        assert Oracle(site).crawl().sitemaps == Oracle(site).crawl(
            max_sitemaps_per_host=5).sitemaps
        monkeypatch.setattr(oracle_module, "MAX_SITEMAP_NESTING", 1)
        assert sm(site, "h0.test", "deep.xml") not in Oracle(site).crawl(
            max_sitemaps_per_host=64).sitemaps

    def test_same_origin_only(self, site: Site) -> None:
        res = Oracle(site).crawl()
        offhost = sm(site, "h0.test", "offhost.xml")
        assert res.sitemap_entries[offhost] == ((sm(site, "h0.test", "only/offhost.html"), ""),)
        others = only(site, OTHER, ["offhost-other-1", "offhost-other-2"]) | {
            "https://h0.test:8443/x/sitemaps/only/offhost-scheme.html"}
        everything = res.requests | res.out_of_scope | res.unreachable | res.blocked
        assert not others & everything  # dropped, not even tried
        index = sm(site, "h0.test", "index.xml")
        assert sm(site, OTHER, "foreign.xml") not in res.sitemap_children[index]
        assert len(res.sitemap_children[index]) == 11
        assert sm(site, OTHER, "foreign.xml") not in everything  # the robots line and the child
        assert res.sitemap_entries[sm(site, "h0.test", "away.xml")] == ()
        assert sm(site, OTHER, "away-to.xml") not in everything

    def test_entries_of_each_file(self, site: Site) -> None:
        res = Oracle(site).crawl()
        for name in ("missing.xml", "notasitemap.xml", "moved.xml", "bomb.xml.gz", "index.xml"):
            assert res.sitemap_entries[sm(site, "h0.test", name)] == ()
        for name, pages in GIVES.items():
            got = [u for u, _ in res.sitemap_entries[sm(site, "h0.test", name)]]
            assert set(got) - {sm(site, "h0.test", "linked.html")} == only(site, "h0.test", pages)
        assert res.sitemap_entries[sm(site, "h0.test", "/sitemap.xml")][0] == (
            sm(site, "h0.test", "only/root-1.html"), "2024-01-01")

    def test_entries_are_at_depth_1(self, site: Site) -> None:
        o = Oracle(site)
        res = o.crawl()
        linked = sm(site, "h0.test", "linked.html")
        assert all(res.depth[u] == 1 for u in given(site, "h0.test") | {linked})
        assert o.crawl(sitemaps="off").depth[linked] == 3  # / -> /x/ -> /x/sitemaps/ -> it
        zero = o.crawl(max_depth=0)
        assert zero.fetched == {site.seed_url}
        assert zero.sitemaps == requested(site, "h0.test")  # the seed reached the robots check
        assert given(site, "h0.test") <= zero.too_deep
        one = o.crawl(max_depth=1)
        assert given(site, "h0.test") | {linked} <= one.fetched

    def test_scope(self, site: Site) -> None:
        o = Oracle(site)
        res = o.crawl([site.url("h2.test")], scope={"h2.test"})
        assert res.sitemaps == requested(site, "h2.test")
        assert o.sitemap_only([site.url("h2.test")], scope={"h2.test"}) == given(site, "h2.test")
        # Only a page URL that passed scope and URL length reads its host's sitemaps.
        assert o.crawl(scope={"h2.test"}).sitemaps == frozenset()  # the seed is out of scope
        assert o.crawl(max_url_length=10).sitemaps == frozenset()
        pred = o.crawl(scope=lambda u: "/only/" not in u)
        assert pred.sitemaps == o.crawl().sitemaps
        assert given(site, "h0.test") <= pred.out_of_scope
        assert not any("/only/" in u for u in pred.fetched)

    def test_robots_disallowed_sitemaps_and_entries(self) -> None:
        rules = ("User-agent: *\nDisallow: /x/sitemaps/nested.xml\n"
                 "Disallow: /x/sitemaps/only/root-1.html\n")
        s = oracle_site(robots={"h0.test": rules, OTHER: "User-agent: *\nDisallow: /sitemap\n"})
        res = Oracle(s).crawl()
        for name in ("nested.xml", "deep.xml", "deeper.xml"):
            assert sm(s, "h0.test", name) not in res.requests
        assert sm(s, "h2.test", "nested.xml") in res.sitemaps
        assert only(s, "h0.test", ["deep"]).isdisjoint(res.fetched)
        assert only(s, "h0.test", ["root-1"]) <= res.blocked
        assert s.url(OTHER, "/sitemap.xml") not in res.requests
        # A blocked page URL reads its host's sitemaps all the same.
        blocked = Oracle(s).crawl([sm(s, "h0.test", "only/root-1.html")])
        assert blocked.fetched == given(s, "h0.test", ["plain.txt", "lower.xml", "urlset.xml.gz",
                                                       "huge.xml", "garbage.xml", "offhost.xml",
                                                       "moved-to.xml"]) | only(s, "h0.test",
                                                                               ["root-2"]) | {
            sm(s, "h0.test", "linked.html")}
        ignoring = Oracle(s).crawl(obey_robots=False)
        assert s.url(OTHER, "/sitemap.xml") in ignoring.sitemaps

    def test_robots_faults_on_feature_hosts(self) -> None:
        # A 5xx robots.txt gives no lines and blocks /sitemap.xml; a huge or slow one keeps
        # the lines (in its first KB), a host without robots.txt serves them alone.
        s = oracle_site([fault("sitemaps", host="h1.test"), fault("robots_5xx", host="h1.test"),
                         fault("sitemaps", host="h2.test"), fault("robots_huge", host="h2.test"),
                         fault("sitemaps"), fault("robots_slow", host="h0.test")])
        assert s.robots_sitemaps("h1.test") == ()
        assert len(s.robots_sitemaps("h2.test")) == len(s.robots_sitemaps("h0.test")) == 4
        body = s.lookup("h2.test", "/robots.txt").body
        assert body is not None and body.index(b"lower.xml") < 1024
        res = Oracle(s).crawl()
        assert not any(u.startswith(s.url("h1.test")) for u in res.sitemaps)
        assert requested(s, "h2.test") | requested(s, "h0.test") == res.sitemaps

    @pytest.mark.parametrize("status", [200, 404, 503])
    def test_lines_count_only_in_a_200_robots_txt(self, status: int) -> None:
        class Answering(Site):  # robots.txt answers ``status``, Sitemap lines and all
            def _robots(self, h):  # type: ignore[no-untyped-def]
                return Node(status, html=False, content_type="text/plain",
                            body=b"Sitemap: /x/sitemaps/lower.xml\n")

        s = Answering(Graph(CONFIG), FAULTS, http_port=8080, https_port=8443)
        lower = sm(s, "h0.test", "lower.xml")
        assert s.robots_sitemaps("h0.test") == ((lower,) if status == 200 else ())
        res = Oracle(s).crawl(obey_robots=status != 503)  # 5xx: everything disallowed
        assert (lower in res.sitemaps) == (status == 200)

    def test_sitemap_only(self, site: Site) -> None:
        o = Oracle(site)
        assert o.sitemap_only() == given(site, "h0.test") | given(site, "h2.test")
        assert sm(site, "h0.test", "linked.html") not in o.sitemap_only()  # linked as well
        assert o.sitemap_only(sitemaps="robots") == o.sitemap_only() - given(
            site, "h0.test", ["/sitemap.xml"]) - given(site, "h2.test", ["/sitemap.xml"])
        assert o.sitemap_only(sitemaps="off") == frozenset()


@pytest.mark.parametrize("obey, mode, max_depth", [
    (True, "all", None), (True, "robots", None), (True, "off", None), (False, "all", None),
    (True, "all", 0), (True, "all", 1),
])
def test_live_crawl_reads_what_the_oracle_says(web: TestWeb, obey: bool, mode: str,
                                               max_depth: int | None) -> None:
    """A plain crawler reading the served files (requests, gzip, lxml) gets the oracle's
    sitemaps, entries and pages, and the server sees exactly ``requests``."""
    web.reset()
    live = crawl_live(web, obey_robots=obey, sitemaps=mode, max_depth=max_depth)
    want = web.oracle.crawl(obey_robots=obey, sitemaps=mode, max_depth=max_depth)
    assert live.fetched == want.fetched
    assert set(live.sitemaps) == want.sitemaps
    assert live.sitemaps == dict(want.sitemap_entries)
    assert live.sitemap_children == dict(want.sitemap_children)
    assert web.log.urls() == want.requests
    assert not web.log.duplicates()
    if obey and mode == "all" and max_depth != 0:
        assert given(web, "h0.test", ["huge.xml", "urlset.xml.gz", "plain.txt"]) <= live.fetched
