"""The oracle: against a plain BFS over the graph, and against a real crawl of the served site."""

from __future__ import annotations

from collections import deque

import pytest
from testweb_helpers import crawl_live

from tools.testweb import InfiniteSiteError, Oracle, SiteConfig, TestWeb, fault, hostile
from tools.testweb import graph as g
from tools.testweb.graph import Graph
from tools.testweb.site import Site

# Slow parts made short so a whole crawl of the hostile web takes seconds.
FAST = {
    "slow_first_byte": {"delay": 0.2},
    "slow_drip": {"interval": 0.001, "size": 40},
    "huge_body": {"size": 8 << 20},
    "gzip_bomb": {"size": 16 << 20},
    "dns_slow": {"delay": 0.2},
    "robots_slow": {"delay": 0.2},
    "robots_huge": {"size": 600_000},
    "malformed": {"depth": 3000},
}


def graph_bfs(gr: Graph, site: Site, max_depth: int | None = None) -> dict[str, int]:
    """URL -> depth straight from the graph's arrays (no robots, no Site.lookup).

    Nodes are ("page", pid, variant), ("redirect", k, hop) and ("missing", k);
    a link costs one depth, a redirect hop none (a 0-1 BFS).
    """

    def url(node: tuple[str, int, int]) -> str:
        kind, a, b = node
        if kind == "page":
            return site.page_url(a) + (f"?v={b}" if b else "")
        if kind == "missing":
            return site.url(g.host_name(gr.missing[a]), f"/missing/{a}.html")
        r = gr.redirects[a]
        return site.url(g.host_name(r.host), f"/r/{a}" if r.hops == 1 else f"/rc/{a}/{b}")

    def edges(node: tuple[str, int, int]) -> list[tuple[tuple[str, int, int], int]]:
        kind, a, b = node
        if kind == "missing":
            return []
        if kind == "redirect":
            r = gr.redirects[a]
            nxt = ("redirect", a, b + 1) if b + 1 < r.hops else ("page", r.target, 0)
            return [(nxt, 0)]
        out = []
        for code in gr.out[a]:
            k, p = g.decode(code)
            target = {g.PAGE: ("page", p, 0), g.VARIANT: ("page", p >> 2, p & 3),
                      g.REDIRECT: ("redirect", p, 0), g.MISSING: ("missing", p, 0)}[k]
            out.append((target, 1))
        return out

    best: dict[tuple[str, int, int], int] = {("page", 0, 0): 0}
    queue = deque([("page", 0, 0)])
    while queue:
        node = queue.popleft()
        d = best[node]
        for nxt, cost in edges(node):
            nd = d + cost
            if (max_depth is not None and nd > max_depth) or best.get(nxt, nd + 1) <= nd:
                continue
            best[nxt] = nd
            (queue.appendleft if cost == 0 else queue.append)(nxt)
    return {url(n): d for n, d in best.items()}


class TestAgainstGraphBFS:
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_whole_site_ignoring_robots(self, seed: int) -> None:
        gr = Graph(SiteConfig(pages=400, hosts=5, seed=seed))
        site = Site(gr, http_port=8080, https_port=8443)
        want = graph_bfs(gr, site)
        got = Oracle(site).crawl(obey_robots=False)
        assert got.fetched == set(want)
        assert dict(got.depth) == want
        assert all(site.page_url(p) in got.fetched for p in range(gr.pages))  # all reachable

    @pytest.mark.parametrize("max_depth", [0, 1, 2, 3])
    def test_max_depth(self, max_depth: int) -> None:
        gr = Graph(SiteConfig(pages=400, hosts=5, seed=4))
        site = Site(gr, http_port=8080, https_port=8443)
        got = Oracle(site).crawl(obey_robots=False, max_depth=max_depth)
        assert got.fetched == set(graph_bfs(gr, site, max_depth))
        assert max(got.depth.values()) <= max_depth
        full = graph_bfs(gr, site)
        assert got.too_deep and all(full[u] == max_depth + 1 for u in got.too_deep)

    def test_robots_block_only_what_they_say(self) -> None:
        gr = Graph(SiteConfig(pages=400, hosts=5, seed=0))
        site = Site(gr, http_port=8080, https_port=8443)
        res = Oracle(site).crawl()
        assert res.blocked
        for url in res.blocked:
            host, target = site.served_by(url)  # type: ignore[misc]
            assert not site.robots_rules(host.name).allowed(target)
        assert res.fetched <= Oracle(site).crawl(obey_robots=False).fetched
        assert res.crawl_delay == {"h1.test": 1.0}
        assert {u.split("/")[2] for u in res.robots} == \
            {u.split("/")[2] for u in res.fetched}


@pytest.fixture(scope="module")
def site() -> Site:
    """One hostile site shared by TestSemantics (building it is the slow part).

    Without sitemaps: their pages would join every crawl seeded on h0 (they are
    checked in test_testweb_sitemaps.py, and with the rest in hostile_web below).
    """
    return Site(Graph(SiteConfig(pages=80, hosts=3, seed=5)), hostile(["sitemaps"], **FAST),
                http_port=8080, https_port=8443)


class TestSemantics:
    def test_seed_only_at_depth_zero(self, site: Site) -> None:
        res = Oracle(site).crawl(max_depth=0)
        assert res.fetched == {site.seed_url}
        assert res.robots == {site.url("h0.test", "/robots.txt")}

    def test_scope_by_hosts_and_predicate(self, site: Site) -> None:
        o = Oracle(site)
        res = o.crawl(scope={"h0.test"}, max_depth=8)
        assert {u.split("/")[2] for u in res.fetched} == {"h0.test:8080"}
        assert site.url("out.test") in res.out_of_scope
        pred = o.crawl(scope=lambda u: "/s1/" not in u, max_depth=3)
        assert not any("/s1/" in u for u in pred.fetched)

    def test_redirect_limit(self, site: Site) -> None:
        chain = site.url("h0.test", "/x/redirects/chain/0")
        res = Oracle(site).crawl([chain], max_redirects=3)
        assert res.fetched == {site.url("h0.test", f"/x/redirects/chain/{i}") for i in range(4)}
        assert res.redirect_limit == {site.url("h0.test", "/x/redirects/chain/4")}
        full = Oracle(site).crawl([chain], max_redirects=10)
        assert site.url("h0.test", "/x/redirects/chain/end") in full.fetched

    def test_redirect_loop_terminates(self, site: Site) -> None:
        res = Oracle(site).crawl([site.url("h0.test", "/x/redirects/loop-a")])
        assert res.fetched == {site.url("h0.test", "/x/redirects/loop-a"),
                               site.url("h0.test", "/x/redirects/loop-b")}

    def test_redirects_add_depth(self, site: Site) -> None:
        chain = site.url("h0.test", "/x/redirects/chain/0")
        res = Oracle(site).crawl([chain], max_depth=2, redirects_add_depth=True)
        assert len(res.fetched) == 3

    def test_spider_trap_needs_a_depth(self, site: Site) -> None:
        with pytest.raises(InfiniteSiteError):
            Oracle(site).crawl(limit=5_000)
        trap = site.url("h0.test", "/x/spider_trap/2024-01")
        res = Oracle(site).crawl([trap], max_depth=3)
        assert len(res.fetched) == 7  # 2024-01 and three months each way

    def test_nofollow_and_noindex(self, site: Site) -> None:
        o = Oracle(site)
        url = site.url("h0.test", "/x/meta_robots/")
        obey, ignore = o.crawl([url]), o.crawl([url], obey_robots=False)
        nf = site.url("h0.test", "/x/meta_robots/nf-1")
        assert nf not in obey.fetched and nf in ignore.fetched
        assert site.url("h0.test", "/x/meta_robots/ob-1") in obey.fetched  # another bot's tag
        assert site.url("h0.test", "/x/meta_robots/hdr-1") not in obey.fetched  # X-Robots-Tag
        assert site.url("h0.test", "/x/meta_robots/noindex") in obey.noindex

    def test_unreachable_hosts(self, site: Site) -> None:
        res = Oracle(site).crawl(max_depth=3)
        names = {u.split("/")[2].split(":")[0] for u in res.unreachable}
        assert names == {"refused.test", "nx.test", "servfail.test", "dnstimeout.test",
                         "badcert.test"}
        assert "http://dnsslow.test:8080/" in res.fetched

    def test_robots_faults(self, site: Site) -> None:
        res = Oracle(site).crawl(max_depth=3)
        assert "http://robots5xx.test:8080/" in res.blocked
        assert "http://robots5xx.test:8080/robots.txt" in res.robots
        assert "http://robotsgarbage.test:8080/e/2.html" in res.fetched
        assert "http://robotshuge.test:8080/e/2.html" in res.blocked
        assert "http://robotsslow.test:8080/e/2.html" in res.blocked

    def test_url_length_limit(self, site: Site) -> None:
        page = site.url("h0.test", "/x/long_urls/page")
        res = Oracle(site).crawl([page], max_url_length=5000)
        assert len(res.fetched) == 2 and len(res.too_long) == 2
        assert 414 in Oracle(site).crawl([page]).status.values()

    def test_wrong_type_not_parsed(self, site: Site) -> None:
        res = Oracle(site).crawl([site.url("h0.test", "/x/wrong_type/1")])
        assert res.fetched == {site.url("h0.test", "/x/wrong_type/1")}
        assert res.faults == {site.url("h0.test", "/x/wrong_type/1"): "wrong_type"}

    def test_response_fault_on_prefix_of_the_graph(self) -> None:
        gr = Graph(SiteConfig(pages=200, hosts=2, seed=1))
        plain = Site(gr, http_port=8080, https_port=8443)
        broken = Site(gr, [fault("status_500", host="h0.test", prefix="/s0/")],
                      http_port=8080, https_port=8443)
        a = Oracle(plain).crawl(obey_robots=False)
        b = Oracle(broken).crawl(obey_robots=False)
        s0 = {u for u in b.fetched if u.startswith("http://h0.test:8080/s0/")}
        assert s0 and all(b.status[u] == 500 for u in s0)
        assert b.fetched <= a.fetched
        slow = Site(gr, [fault("slow_first_byte", host="h0.test", prefix="/")],
                    http_port=8080, https_port=8443)
        assert Oracle(slow).crawl(obey_robots=False).fetched == a.fetched  # keeps links


# -- against a real crawl -------------------------------------------------------------


@pytest.fixture(scope="module")
def base_web():
    with TestWeb(SiteConfig(pages=70, hosts=3, seed=9)) as web:
        yield web


@pytest.fixture(scope="module")
def hostile_web():
    with TestWeb(SiteConfig(pages=40, hosts=3, seed=2), faults=hostile(**FAST)) as web:
        yield web


@pytest.mark.parametrize("obey", [True, False])
def test_live_crawl_equals_oracle(base_web: TestWeb, obey: bool) -> None:
    base_web.reset()
    live = crawl_live(base_web, obey_robots=obey)
    want = base_web.oracle.crawl(obey_robots=obey)
    assert live.fetched == want.fetched
    assert live.robots == want.robots
    assert live.status == dict(want.status)
    assert base_web.log.urls() == want.requests  # what the server saw
    assert not base_web.log.duplicates()


def test_live_crawl_depth_and_scope(base_web: TestWeb) -> None:
    base_web.reset()
    live = crawl_live(base_web, max_depth=2, scope={"h0.test", "h2.test"})
    want = base_web.oracle.crawl(max_depth=2, scope={"h0.test", "h2.test"})
    assert live.fetched == want.fetched
    assert any(u.startswith("https://h2.test") for u in want.fetched)


@pytest.mark.parametrize("obey", [True, False])
def test_live_crawl_of_hostile_web(hostile_web: TestWeb, obey: bool) -> None:
    hostile_web.reset()
    live = crawl_live(hostile_web, obey_robots=obey, max_depth=5)
    want = hostile_web.oracle.crawl(obey_robots=obey, max_depth=5)
    assert live.fetched == want.fetched, (live.fetched ^ want.fetched)
    assert live.unreachable == want.unreachable
    assert hostile_web.log.urls() == want.requests
