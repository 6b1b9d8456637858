"""The ``scripts`` feature: pages whose links appear only after JavaScript runs,
checked over HTTP (lxml on the server HTML), in headless Chromium (the rendered
DOM), and in the oracle's ``render`` option."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator

import lxml.html
import pytest
import requests
from testweb_helpers import crawl_live, plain_normalize

from tools.testweb import Oracle, SiteConfig, TestWeb, fault
from tools.testweb.graph import Graph
from tools.testweb.robots import RobotsRules, parse
from tools.testweb.scripted import PAGES
from tools.testweb.site import Site

TIMEOUT = 5.0
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_TIMEOUT = 60.0  # a safety net for a hung browser, not a speed assertion
HOSTS = ("h0.test", "h1.test")
# page -> (links in the server HTML, links only its scripts add, subresources)
EXPECTED = {
    "inline.html": (["t/plain.html"], ["t/inline.html"], []),
    "timeout.html": ([], ["t/timeout.html"], []),
    "fetch.html": ([], ["t/fetch-1.html", "t/fetch-2.html"], ["data.json"]),
    "external.html": ([], ["t/external.html"], ["app.js"]),
    "endless.html": (["t/after-endless.html"], [], []),
    "hog.html": (["t/after-hog.html"], [], []),
}
RENDERABLE = ["inline.html", "timeout.html", "fetch.html", "external.html"]
FAULTS = [fault("scripts"), fault("scripts", host="h1.test", delay_ms=100)]


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    with TestWeb(SiteConfig(pages=20, hosts=3, seed=3), faults=FAULTS) as w:
        yield w


@pytest.fixture
def http(web: TestWeb) -> Iterator[requests.Session]:
    web.reset()
    with web.session() as s:
        yield s


def at(web: TestWeb, host: str, names: list[str]) -> set[str]:
    return {web.url(host, "/x/scripts/" + n) for n in names}


def script_only(web: TestWeb, hosts: tuple[str, ...] = HOSTS,
                pages: list[str] = RENDERABLE) -> set[str]:
    return {u for h in hosts for p in pages for u in at(web, h, EXPECTED[p][1])}


def get(http: requests.Session, url: str) -> requests.Response:
    return http.get(url, timeout=TIMEOUT, allow_redirects=False)


def hrefs(body: bytes, url: str) -> set[str]:
    """Canonical <a href> links of HTML as lxml parses it (no scripts run)."""
    doc = lxml.html.document_fromstring(body)
    found = (plain_normalize(a.get("href"), url) for a in doc.iter("a") if a.get("href"))
    return {u for u in found if u is not None}


class TestServedPages:
    def test_hub_links_the_index_and_the_index_links_the_pages(
            self, web: TestWeb, http: requests.Session) -> None:
        hub = web.url("h0.test", "/x/")
        index = web.url("h0.test", "/x/scripts/")
        assert index in hrefs(get(http, hub).content, hub)
        r = get(http, index)
        assert r.status_code == 200
        assert hrefs(r.content, index) == at(web, "h0.test", list(PAGES))

    @pytest.mark.parametrize("page", list(EXPECTED))
    def test_script_links_are_only_in_scripts(self, web: TestWeb, http: requests.Session,
                                              page: str) -> None:
        server, script, subs = EXPECTED[page]
        url = web.url("h0.test", "/x/scripts/" + page)
        r = get(http, url)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
        assert hrefs(r.content, url) == at(web, "h0.test", server)
        node = web.oracle.describe(url)
        assert node is not None
        assert set(node.links) == at(web, "h0.test", server)
        assert set(node.script_links) == at(web, "h0.test", script)
        assert set(node.subresources) == at(web, "h0.test", subs)
        doc = lxml.html.document_fromstring(r.content)
        code = "".join(s.text or "" for s in doc.iter("script"))
        srcs = {s.get("src") for s in doc.iter("script") if s.get("src")}
        # Each subresource is named by the page: a <script src> or a fetch() argument.
        for sub in subs:
            assert sub in srcs or f"fetch('{sub}')" in code
        # Each script-only href is written in the page's script or a subresource.
        text = code + "".join(get(http, web.url("h0.test", "/x/scripts/" + s)).text
                              for s in subs)
        for href in script:
            assert href in text
        if page in ("endless.html", "hog.html"):
            assert "for (;;)" in code or "for(;;)" in code

    def test_subresource_types(self, web: TestWeb, http: requests.Session) -> None:
        js = get(http, web.url("h0.test", "/x/scripts/app.js"))
        assert js.status_code == 200 and js.headers["Content-Type"] == "text/javascript"
        assert "addLink('t/external.html')" in js.text
        data = get(http, web.url("h0.test", "/x/scripts/data.json"))
        assert data.status_code == 200 and data.headers["Content-Type"] == "application/json"
        assert json.loads(data.content) == {"links": ["t/fetch-1.html", "t/fetch-2.html"]}
        for name in ("app.js", "data.json"):
            node = web.oracle.describe(web.url("h0.test", "/x/scripts/" + name))
            assert node is not None and node.status == 200 and not node.html

    def test_targets_are_leaves_and_the_rest_is_404(self, web: TestWeb,
                                                    http: requests.Session) -> None:
        targets = {t for server, script, _ in EXPECTED.values() for t in server + script}
        assert len(targets) == 8
        for url in at(web, "h0.test", sorted(targets)):
            r = get(http, url)
            assert r.status_code == 200 and hrefs(r.content, url) == set()
        for name in ("t/nope.html", "other.js", "t/", "inline.htm", "data.json/x"):
            assert get(http, web.url("h0.test", "/x/scripts/" + name)).status_code == 404

    def test_timeout_uses_delay_ms(self, web: TestWeb, http: requests.Session) -> None:
        for host, delay in (("h0.test", 300), ("h1.test", 100)):
            text = get(http, web.url(host, "/x/scripts/timeout.html")).text
            assert f"}}, {delay});" in text

    def test_plain_crawl_equals_oracle_without_render(self, web: TestWeb) -> None:
        web.reset()
        seeds = [web.url(h, "/x/scripts/") for h in HOSTS]
        live = crawl_live(web, seeds=seeds)
        want = web.oracle.crawl(seeds=seeds)
        assert live.fetched == want.fetched
        assert not live.fetched & script_only(web)
        assert web.log.urls() == want.requests  # no app.js, no data.json


def chromium_dom(url: str) -> str:
    """The DOM headless Chromium renders for ``url`` (``*.test`` mapped to loopback)."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=2000",
             # The server routes by Host: the site's names go to loopback, all others nowhere.
             "--host-resolver-rules=MAP *.test 127.0.0.1, MAP * ~NOTFOUND",
             "--dump-dom", url],
            capture_output=True, timeout=CHROMIUM_TIMEOUT, check=True,
        )
    return out.stdout.decode()


@pytest.mark.system_packages("chromium")
class TestChromium:
    @pytest.mark.parametrize("page", RENDERABLE)
    def test_rendered_dom_has_the_script_links(self, web: TestWeb, page: str) -> None:
        host = "h1.test"
        url = web.url(host, "/x/scripts/" + page)
        assert url.startswith("http://h1.test:")  # resolved to 127.0.0.1 by the MAP rule
        web.reset()
        dom = chromium_dom(url)
        server, script, subs = EXPECTED[page]
        assert hrefs(dom.encode(), url) == at(web, host, server + script)
        node = web.oracle.describe(url)
        assert node is not None
        assert hrefs(dom.encode(), url) == set(node.links) | set(node.script_links)
        # What the browser asked for: the page and its subresources (and maybe a favicon).
        asked = {r.target for r in web.log.records(host=host)} - {"/favicon.ico"}
        assert asked == {"/x/scripts/" + n for n in [page, *subs]}


def oracle_site(robots: dict[str, str] | None = None) -> Site:
    """The scripts site without a server; ``robots`` replaces hosts' robots.txt text."""

    class RobotsSite(Site):
        def robots_rules(self, host: str, user_agent: str = "*") -> RobotsRules:
            if robots and host in robots:
                return parse(robots[host], user_agent)
            return super().robots_rules(host, user_agent)

    return RobotsSite(Graph(SiteConfig(pages=20, hosts=3, seed=3)), FAULTS, http_port=8080,
                      https_port=8443)


class TestOracleRender:
    def test_render_adds_exactly_the_script_links(self, web: TestWeb) -> None:
        plain = web.oracle.crawl()
        rendered = web.oracle.crawl(render=True)
        assert rendered.fetched - plain.fetched == script_only(web)
        assert plain.fetched <= rendered.fetched
        assert plain.subresources == frozenset()
        subs = {u for h in HOSTS for u in at(web, h, ["app.js", "data.json"])}
        assert rendered.subresources == subs
        assert rendered.requests == rendered.fetched | rendered.robots | subs | rendered.sitemaps
        assert not subs & rendered.fetched  # requested by the browser, not crawled
        for url in script_only(web):
            assert rendered.depth[url] == rendered.depth[url.split("/t/")[0] + "/"] + 2

    def test_render_false_is_the_default(self, web: TestWeb) -> None:
        assert web.oracle.crawl(render=False) == web.oracle.crawl()

    def test_render_by_host_collection(self, web: TestWeb) -> None:
        plain = web.oracle.crawl()
        res = web.oracle.crawl(render={"h1.test"})
        assert res.fetched - plain.fetched == script_only(web, ("h1.test",))
        assert res.subresources == at(web, "h1.test", ["app.js", "data.json"])
        assert web.oracle.crawl(render="h1.test") == res  # one name, as for scope
        assert web.oracle.crawl(render={"h2.test"}) == plain

    def test_render_by_predicate(self, web: TestWeb) -> None:
        plain = web.oracle.crawl()
        res = web.oracle.crawl(render=lambda url: url.endswith("/external.html"))
        assert res.fetched - plain.fetched == script_only(web, pages=["external.html"])
        assert res.subresources == {u for h in HOSTS for u in at(web, h, ["app.js"])}

    def test_render_ignoring_robots(self, web: TestWeb) -> None:
        ignoring = web.oracle.crawl(render=True, obey_robots=False)
        assert script_only(web) <= ignoring.fetched
        assert len(ignoring.subresources) == 4

    def test_robots_disallowing_a_subresource_keeps_it_out(self) -> None:
        rules = "User-agent: *\nDisallow: /x/scripts/data.json\n"
        site = oracle_site({"h0.test": rules})
        res = Oracle(site).crawl(render=True)
        blocked = site.url("h0.test", "/x/scripts/data.json")
        assert blocked not in res.subresources and blocked not in res.requests
        assert site.url("h0.test", "/x/scripts/app.js") in res.subresources
        assert site.url("h1.test", "/x/scripts/data.json") in res.subresources
        # fetch.html's links come from the blocked data.json: without it there are none.
        fetched_links = {site.url(h, f"/x/scripts/t/fetch-{i}.html") for h in HOSTS
                         for i in (1, 2)}
        assert res.fetched & fetched_links == {
            site.url("h1.test", f"/x/scripts/t/fetch-{i}.html") for i in (1, 2)}
        assert site.url("h0.test", "/x/scripts/t/external.html") in res.fetched
        # Ignoring robots, the browser gets it again.
        assert blocked in Oracle(site).crawl(render=True, obey_robots=False).subresources

    def test_subresources_skip_scope_and_depth_but_not_robots(self) -> None:
        site = oracle_site()
        res = Oracle(site).crawl(render={"h1.test"}, scope={"h0.test"},
                                 seeds=[site.url("h1.test", "/x/scripts/external.html")])
        # The page is out of scope; nothing is rendered or requested for it.
        assert res.fetched == frozenset() and res.subresources == frozenset()
        res = Oracle(site).crawl(render=True, max_depth=0,
                                 seeds=[site.url("h1.test", "/x/scripts/external.html")])
        assert res.subresources == {site.url("h1.test", "/x/scripts/app.js")}
        assert res.robots == {site.url("h1.test", "/robots.txt")}
        assert res.fetched == {site.url("h1.test", "/x/scripts/external.html")}
