"""The generated site without any server: determinism, shape, reachability, HTML == Node."""

from __future__ import annotations

import hashlib
from collections import deque

import lxml.html
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from testweb_helpers import plain_normalize

from tools.testweb import SiteConfig, fault, hostile
from tools.testweb import graph as g
from tools.testweb.faults import KINDS, RESPONSE
from tools.testweb.graph import Graph
from tools.testweb.oracle import Oracle
from tools.testweb.site import Site
from tools.testweb.urls import REFUSED_IP, normalize, quote_path


def _site(pages: int = 120, hosts: int = 4, seed: int = 7, faults=()) -> Site:
    return Site(Graph(SiteConfig(pages=pages, hosts=hosts, seed=seed)), faults,
                http_port=8080, https_port=8443)


def _digest(site: Site) -> str:
    h = hashlib.sha256()
    for pid in range(site.graph.pages):
        host = g.host_name(site.graph.host_of[pid])
        node = site.lookup(host, site.graph.page_path(pid))
        h.update(site.body(host, node))
        h.update(repr(node.links).encode())
    return h.hexdigest()


class TestDeterminism:
    def test_same_config_same_bytes(self) -> None:
        assert _digest(_site()) == _digest(_site())

    def test_other_seed_other_site(self) -> None:
        assert _digest(_site(seed=7)) != _digest(_site(seed=8))

    def test_graph_arrays_identical(self) -> None:
        config = SiteConfig(pages=300, hosts=5, seed=3)
        a, b = Graph(config), Graph(config)
        assert list(a.host_of) == list(b.host_of)
        assert [list(x) for x in a.out] == [list(x) for x in b.out]
        assert a.redirects == b.redirects and a.missing == b.missing

    def test_hostile_pages_deterministic(self) -> None:
        one, two = _site(faults=hostile()), _site(faults=hostile())
        for url in ("/x/binary/octet", "/x/malformed/broken", "/x/charsets/sjis"):
            assert one.body("h0.test", one.lookup("h0.test", url)) == \
                two.body("h0.test", two.lookup("h0.test", url))


class TestShape:
    def test_every_page_reachable_from_h0_home(self) -> None:
        gr = Graph(SiteConfig(pages=2000, hosts=7, seed=11))
        seen = {0}
        queue = deque([0])
        while queue:
            for code in gr.out[queue.popleft()]:
                kind, payload = g.decode(code)
                target = {g.PAGE: payload, g.VARIANT: payload >> 2}.get(kind)
                if kind == g.REDIRECT:
                    target = gr.redirects[payload].target
                if target is not None and target not in seen:
                    seen.add(target)
                    queue.append(target)
        assert seen == set(range(gr.pages))

    def test_links_per_page_and_sizes(self) -> None:
        site = _site(pages=300)
        gr = site.graph
        for pid in range(gr.pages):
            node = site.lookup(g.host_name(gr.host_of[pid]), gr.page_path(pid))
            assert len(node.links) >= 10
            body = site.body(g.host_name(gr.host_of[pid]), node)
            assert len(body) >= gr.page_size(pid) >= 5_000
        # 10-40 drawn links, plus tree children on a few pages
        assert sum(len(o) for o in gr.out) / gr.pages < 45

    def test_in_degree_is_skewed(self) -> None:
        deg = sorted(Graph(SiteConfig(pages=3000, hosts=10, seed=2)).in_degree(), reverse=True)
        assert deg[0] > 20 * deg[len(deg) // 2]
        assert sum(deg[:30]) > 0.25 * sum(deg)  # the top 1% get a quarter of the links

    def test_site_has_variants_redirects_missing_and_cross_host_links(self) -> None:
        site = _site(pages=400)
        links = {u for pid in range(400) for u in site.lookup(
            g.host_name(site.graph.host_of[pid]), site.graph.page_path(pid)).links}
        assert any("?v=" in u for u in links)
        assert any("/r/" in u for u in links) and any("/rc/" in u for u in links)
        assert any("/missing/" in u for u in links)
        oracle = Oracle(site)
        statuses = {oracle.describe(u).status for u in links}  # type: ignore[union-attr]
        assert {200, 301, 302, 404} <= statuses

    def test_page_at_round_trip_and_rejects_others(self) -> None:
        gr = Graph(SiteConfig(pages=200, hosts=3, seed=1))
        for pid in range(gr.pages):
            assert gr.page_at(gr.host_of[pid], gr.page_path(pid)) == pid
            if pid >= 3:
                assert gr.page_at((gr.host_of[pid] + 1) % 3, gr.page_path(pid)) is None
        assert gr.page_at(0, "/s0/p0.html") is None  # home pages live at /
        assert gr.page_at(0, "/s9/p100.html") is None

    @given(st.text(min_size=1, max_size=40))
    def test_unknown_paths_are_404(self, text: str) -> None:
        for prefix in ("/q/", "/s9/", "/r/x", "/rc/x", "/x/", "/missing/"):
            target = quote_path(prefix + text).replace("?", "%3F")
            assert _SITE.lookup("h1.test", target).status == 404, target

    def test_config_validation(self) -> None:
        with pytest.raises(ValueError):
            SiteConfig(pages=2, hosts=3)
        with pytest.raises(ValueError):
            SiteConfig(hosts=2, tls_hosts=(5,))


_SITE = _site()


def _html_links(body: bytes, url: str) -> set[str]:
    doc = lxml.html.document_fromstring(body)
    return {plain_normalize(a.get("href"), url) for a in doc.iter("a") if a.get("href")} - {None}


class TestHtmlMatchesNodes:
    """What the HTML links to (parsed, normalized independently) is exactly Node.links."""

    def test_every_page_of_a_site(self) -> None:
        site = _site(pages=150, hosts=4, faults=hostile())
        for pid in range(150):
            host = g.host_name(site.graph.host_of[pid])
            url = site.page_url(pid)
            node = site.lookup(host, site.graph.page_path(pid))
            assert _html_links(site.body(host, node), url) - {url} == set(node.links) - {url}

    @settings(max_examples=15, deadline=None)
    @given(seed=st.integers(0, 2**32), pages=st.integers(3, 60), hosts=st.integers(1, 3))
    def test_any_seed(self, seed: int, pages: int, hosts: int) -> None:
        site = Site(Graph(SiteConfig(pages=pages, hosts=hosts, seed=seed, min_size=500,
                                     max_size=1000)), http_port=80, https_port=443)
        for pid in range(0, pages, 5):
            host = g.host_name(site.graph.host_of[pid])
            url = site.page_url(pid)
            node = site.lookup(host, site.graph.page_path(pid))
            assert _html_links(site.body(host, node), url) - {url} == set(node.links) - {url}
            assert all(normalize(link) == link for link in node.links)

    def test_default_ports_are_left_out(self) -> None:
        site = Site(Graph(SiteConfig(pages=10, hosts=2)), http_port=80, https_port=443)
        assert site.seed_url == "http://h0.test/"
        assert site.url("h1.test") == "https://h1.test/"


class TestHosts:
    def test_dedicated_hosts_and_records(self) -> None:
        site = _site(faults=hostile())
        records = site.dns_records()
        assert records["refused.test"] == REFUSED_IP
        assert "nx.test" not in records
        assert records["xn--bcher-kva.test"] == "127.0.0.1"
        assert all(ip.startswith("127.") for ip in records.values())
        assert site.hosts["badcert.test"].scheme == "https"
        assert not site.hosts["dnstimeout.test"].reachable

    def test_host_fault_on_a_site_host(self) -> None:
        site = _site(faults=[fault("refused", host="h2.test")])
        assert site.dns_records()["h2.test"] == REFUSED_IP

    def test_fault_validation(self) -> None:
        with pytest.raises(ValueError, match="unknown fault"):
            fault("nope")
        with pytest.raises(ValueError, match="no parameter"):
            fault("reset", delay=1)
        with pytest.raises(ValueError, match="takes no prefix"):
            fault("spider_trap", prefix="/a/")
        with pytest.raises(ValueError, match="unknown host"):
            _site(faults=[fault("refused", host="nope.test")])
        with pytest.raises(ValueError, match="HTTPS"):
            _site(faults=[fault("bad_cert", host="h0.test")])


@pytest.mark.parametrize("kind", [k for k, v in KINDS.items() if v.group == RESPONSE])
def test_response_faults_keep_links_as_the_catalog_says(kind: str) -> None:
    """A response fault on a generated page: its links survive iff keeps_links."""
    gr = Graph(SiteConfig(pages=20, hosts=1, seed=1))
    site = Site(gr, [fault(kind, prefix="/s")], http_port=8080)
    pid = next(p for p in range(1, 20) if gr.page_path(p).startswith("/s"))
    node = site.lookup("h0.test", gr.page_path(pid))
    assert node.fault == kind
    assert bool(node.links) == KINDS[kind].keeps_links
    assert site.lookup("h0.test", "/robots.txt").fault is None  # robots.txt is never hit


def test_an_extra_hosts_home_page_links_its_hostile_hub_in_the_html() -> None:
    """The oracle follows Node.links; a crawler sees only the body: they must agree."""
    faults = [fault("dns_slow"), fault("spider_trap", host="dnsslow.test")]
    site = Site(Graph(SiteConfig(pages=10, hosts=1)), faults, http_port=80, https_port=443)
    node = site.lookup("dnsslow.test", "/")
    doc = lxml.html.fromstring(site.body("dnsslow.test", node))
    hrefs = [site.url("dnsslow.test", a.get("href")) for a in doc.iter("a")]
    assert site.url("dnsslow.test", "/x/") in node.links
    assert sorted(hrefs) == sorted(node.links)
