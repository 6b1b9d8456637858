"""The site: graph + faults + the ports it is served on -> what each URL answers.

Theory of operation: ``Site.lookup(host, target)`` is a pure function from a
request to a :class:`Node`. The server sends Nodes; the oracle walks them
(``Node.links``, ``Node.location``) without parsing any HTML. Keeping one
function behind both is what makes the oracle exact; the tests check the
other half (that the HTML really contains those links) by crawling.

URLs carry the server's port (``http://h0.test:8080/``) because a crawler
connects to the resolved IP on the URL's port; on port 80/443 the port is
omitted, as the canonical form requires.

Hosts: ``h0.test ... h{H-1}.test`` (the graph), plus extra hosts that some
faults bring (``refused.test``, ``out.test``, an IDN host, ...). Each host
has a scheme, the IP its DNS name resolves to, and its DNS behaviour.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from random import Random

from . import graph as g
from . import hostile_pages as hostile
from . import sitemapped
from .faults import FEATURE, HOST, HUB_HOST, OUT_HOST, RESPONSE, Fault
from .graph import Graph
from .model import NOT_FOUND, Host, Node, text_node
from .render import TextPool, leaf_page, link_list, render_page
from .robots import ALLOW_ALL, DISALLOW_ALL, RobotsRules, base_robots, parse, sitemap_values
from .urls import LOOPBACK_IP, REFUSED_IP, idna_host, normalize, origin, split, upper_pct

log = logging.getLogger(__name__)

ROBOTS = "/robots.txt"
MAX_TARGET = 65_536  # longer request-targets get 414 URI Too Long
EXTRA_PAGES = ("/e/1.html", "/e/2.html")  # the pages of every extra host
PAGE_CACHE = 16_384  # generated pages kept rendered (about 200 MB at most)


class Site:
    """A generated site bound to its ports. Immutable; thread-safe."""

    def __init__(
        self,
        graph: Graph,
        faults: Iterable[Fault] = (),
        *,
        http_port: int,
        https_port: int | None = None,
        address: str = LOOPBACK_IP,
    ) -> None:
        self.graph = graph
        self.address = address  # what every host's name resolves to (the server's)
        self.config = graph.config
        self.faults = tuple(faults)
        self.http_port = http_port
        self.https_port = https_port
        self.pool = TextPool(self.config.seed)
        self.hosts: dict[str, Host] = {}
        self._build_hosts()
        # Response faults per host, longest prefix first; features per host.
        self.response_faults: dict[str, list[tuple[str, Fault]]] = {}
        self.features: dict[str, dict[str, Fault]] = {}
        for f in self.faults:
            group = f.spec.group
            if group == RESPONSE:
                prefix = f.prefix if f.prefix is not None else f.mount
                self.response_faults.setdefault(f.where, []).append((prefix, f))
            elif group == FEATURE:
                self.features.setdefault(f.where, {})[f.kind] = f
        for rules in self.response_faults.values():
            rules.sort(key=lambda pf: len(pf[0]), reverse=True)
        # Caches (pure functions of their keys): page URLs, links, rendered bodies.
        self._page_urls: list[str | None] = [None] * graph.pages
        self._links_cache = lru_cache(maxsize=PAGE_CACHE)(self._page_links)
        self.page_cache = lru_cache(maxsize=PAGE_CACHE)(self._render)

    # -- hosts and URLs ------------------------------------------------------

    def _build_hosts(self) -> None:
        tls = self.config.tls
        for i in range(self.config.hosts):
            name = g.host_name(i)
            self.hosts[name] = Host(name, "https" if i in tls else "http", i, self.address)
        extra: list[tuple[str, str]] = []
        for f in self.faults:
            if f.kind == "redirects":
                extra.append((OUT_HOST, "http"))
            elif f.kind == "idn":
                idn = idna_host(str(f.get("name")))
                if idn is None:
                    raise ValueError(f"bad IDN host name {f.get('name')!r}")
                extra.append((idn, "http"))
            elif f.spec.group == HOST and f.host is None:
                extra.append((f.where, "https" if f.spec.tls else "http"))
        for name, scheme in extra:
            self.hosts.setdefault(name, Host(name, scheme, None, self.address))
        for f in self.faults:
            if f.spec.group != HOST:
                continue
            host = self.hosts.get(f.where)
            if host is None:
                raise ValueError(f"fault {f.kind!r} names unknown host {f.where!r}")
            self.hosts[f.where] = _break(host, f)
        if any(h.scheme == "https" for h in self.hosts.values()) and self.https_port is None:
            raise ValueError("the site has HTTPS hosts but no https_port")

    def origin(self, host: str) -> str:
        h = self.hosts[host]
        port = self.https_port if h.scheme == "https" else self.http_port
        assert port is not None
        return origin(h.scheme, host, port)

    def url(self, host: str, target: str = "/") -> str:
        return self.origin(host) + target

    @property
    def seed_url(self) -> str:
        return self.url(HUB_HOST)

    def page_url(self, pid: int) -> str:
        url = self._page_urls[pid]
        if url is None:
            url = self.url(g.host_name(self.graph.host_of[pid]), self.graph.page_path(pid))
            self._page_urls[pid] = url
        return url

    def served_by(self, url: str) -> tuple[Host, str] | None:
        """The host and request-target a correct crawler reaches for ``url``, if any.

        None when the URL is not http(s), names no host of the site (NXDOMAIN)
        or uses a scheme or port the host is not served on (nothing listens).
        """
        t = split(url)
        if t is None:
            return None
        host = self.hosts.get(t.host)
        if host is None or host.scheme != t.scheme:
            return None
        port = self.https_port if t.scheme == "https" else self.http_port
        if t.port != port:
            return None
        return host, t.target

    def dns_records(self) -> dict[str, str]:
        return {h.name: h.ip for h in self.hosts.values() if h.dns != "nxdomain"}

    # -- answers -------------------------------------------------------------

    def lookup(self, host: str, target: str) -> Node:
        """What ``host`` answers for ``target`` (path plus query, as sent)."""
        h = self.hosts.get(host)
        if h is None:
            return text_node(421, "Misdirected request: no such host here.")
        if len(target) > MAX_TARGET:
            return text_node(414, "URI too long.")
        path, _, query = upper_pct(target).partition("?")
        if path == ROBOTS:
            return self._robots(h)
        node = self._route(h, path, query)
        for prefix, f in self.response_faults.get(host, ()):
            if path.startswith(prefix):
                return hostile.apply_response_fault(self, host, node, f)
        return node

    def _route(self, h: Host, path: str, query: str) -> Node:
        if path == sitemapped.ROOT:  # a 404 (below) unless the host has the feature
            f = self.features.get(h.name, {}).get("sitemaps")
            if f is not None:
                return sitemapped.root(self, f, h.name)
        if path.startswith("/x/"):
            return self._hostile(h, path)
        if h.index is None:
            return self._extra(h, path)
        pid = self.graph.page_at(h.index, path)
        if pid is not None:
            return Node(200, links=self._all_links(h.name, pid), page=pid)
        return self._special(h, path)

    def _all_links(self, host: str, pid: int) -> tuple[str, ...]:
        """The links of page ``pid``: the graph's, plus the hub on a home page."""
        links = self._links_cache(pid)
        if pid < self.config.hosts and self._has_hub(host):
            links += (self.url(host, "/x/"),)
        return links

    def _page_links(self, pid: int) -> tuple[str, ...]:
        out: list[str] = []
        gr = self.graph
        for code in gr.out[pid]:
            kind, payload = g.decode(code)
            if kind == g.PAGE:
                out.append(self.page_url(payload))
            elif kind == g.VARIANT:
                out.append(f"{self.page_url(payload >> 2)}?v={payload & 3}")
            elif kind == g.REDIRECT:
                r = gr.redirects[payload]
                tail = f"/r/{payload}" if r.hops == 1 else f"/rc/{payload}/0"
                out.append(self.url(g.host_name(r.host), tail))
            else:
                out.append(self.url(g.host_name(gr.missing[payload]), f"/missing/{payload}.html"))
        return tuple(out)

    def _special(self, h: Host, path: str) -> Node:
        """Redirects of the graph; anything else is a 404."""
        parts = path.split("/")
        gr = self.graph
        try:
            if len(parts) == 3 and parts[1] == "r":
                k, hop = int(parts[2]), 0
                canon, chained = f"/r/{k}", False
            elif len(parts) == 4 and parts[1] == "rc":
                k, hop = int(parts[2]), int(parts[3])
                canon, chained = f"/rc/{k}/{hop}", True
            else:
                return NOT_FOUND
        except ValueError:
            return NOT_FOUND
        if path != canon or not 0 <= k < len(gr.redirects):
            return NOT_FOUND
        r = gr.redirects[k]
        if r.host != h.index or chained != (r.hops > 1) or not 0 <= hop < r.hops:
            return NOT_FOUND
        if hop + 1 < r.hops:
            raw = f"/rc/{k}/{hop + 1}"
            loc = self.url(h.name, raw)
        else:
            loc = raw = self.page_url(r.target)
        return Node(r.status, location=loc, raw_location=raw, html=False, body=b"")

    def _extra(self, h: Host, path: str) -> Node:
        if path == "/":
            hrefs = list(EXTRA_PAGES) + (["/x/"] if self._has_hub(h.name) else [])
            links = tuple(self.url(h.name, p) for p in hrefs)  # exactly what the body links
            return Node(200, links=links, body=link_list(f"Home of {h.name}", hrefs))
        if path in EXTRA_PAGES:
            return Node(200, body=leaf_page(f"{h.name}{path}"))
        return NOT_FOUND

    def _has_hub(self, host: str) -> bool:
        if host == HUB_HOST and any(f.dedicated and f.spec.group == HOST for f in self.faults):
            return True
        return bool(self.features.get(host)) or any(
            prefix.startswith("/x/") for prefix, _ in self.response_faults.get(host, ())
        )

    def _hostile(self, h: Host, path: str) -> Node:
        if path == "/x/":
            if not self._has_hub(h.name):
                return NOT_FOUND
            entries = self.hub_entries(h.name)
            return Node(200, links=tuple(entries), body=link_list("Hostile web", entries))
        kind = path[3:].split("/", 1)[0]
        f = self.features.get(h.name, {}).get(kind)
        if f is not None:
            return hostile.feature(self, f, h.name, path[len(f.mount) :])
        for prefix, rf in self.response_faults.get(h.name, ()):
            if rf.dedicated and prefix == f"/x/{kind}/":
                return hostile.dedicated_page(self, rf, h.name, path[len(prefix) :])
        return NOT_FOUND

    def hub_entries(self, host: str) -> list[str]:
        """Canonical URLs linked from ``host``'s ``/x/`` index."""
        out = [hostile.entry(self, f, host) for f in self.features.get(host, {}).values()]
        out += [
            self.url(host, f"{prefix}1")
            for prefix, f in self.response_faults.get(host, ())
            if f.dedicated
        ]
        if host == HUB_HOST:
            for f in self.faults:
                if f.spec.group == HOST and f.dedicated:
                    out.append(self.url(f.where))
        return out

    # -- robots.txt ------------------------------------------------------------

    def _robots(self, h: Host) -> Node:
        base = base_robots(h.index, self.config.crawl_delay) if h.index is not None else None
        feature = self.features.get(h.name, {}).get("sitemaps")
        lines = sitemapped.robots_lines(self, feature, h.name) if feature is not None else ""
        f = h.robots_fault
        if lines:
            base = (base or "") + lines  # a robots.txt just for the lines, if need be
        if f is None:
            if base is None:
                return NOT_FOUND.but(html=False)
            return Node(200, html=False, content_type="text/plain", body=base.encode())
        if h.index is None:
            base = "User-agent: *\nDisallow: /e/2.html\n" + lines
        return hostile.robots_fault(f, base)

    def robots_rules(self, host: str, user_agent: str = "*") -> RobotsRules:
        """The rules a crawler obeying robots.txt applies on ``host`` (RFC 9309 §2.3.1)."""
        node = self._robots(self.hosts[host])
        if node.status >= 500:
            return DISALLOW_ALL  # "unreachable": assume complete disallow
        if node.status >= 400 or node.body is None:
            return ALLOW_ALL
        return parse(node.body.decode("utf-8", "replace"), user_agent)

    def robots_sitemaps(self, host: str) -> tuple[str, ...]:
        """The Sitemap lines of ``host``'s robots.txt, resolved against its URL and
        canonical, in file order; none unless robots.txt answers 200."""
        node = self._robots(self.hosts[host])
        if node.status != 200 or node.body is None:
            return ()
        base = self.url(host, ROBOTS)
        found = (normalize(v, base) for v in sitemap_values(node.body.decode("utf-8", "replace")))
        return tuple(u for u in found if u is not None)

    # -- bodies ------------------------------------------------------------------

    def body(self, host: str, node: Node) -> bytes:
        """The bytes of a Node's body (rendering generated pages, cached)."""
        if node.body is not None:
            return node.body
        if node.lazy is not None:
            return node.lazy()
        assert node.page is not None
        return self.page_cache(host, node.page)

    def _render(self, host: str, pid: int) -> bytes:
        links = self._all_links(host, pid)  # not lookup(): faults may hide the links
        return render_page(
            self.pool,
            seed=self.config.seed,
            pid=pid,
            host=host,
            page_origin=self.origin(host),
            page_path=self.graph.page_path(pid),
            links=links,
            size=self.graph.page_size(pid),
        )

    def rng(self, *salt: object) -> Random:
        """A deterministic generator for one hostile page."""
        return Random(f"{self.config.seed}:{':'.join(map(str, salt))}")


def _break(host: Host, f: Fault) -> Host:
    """``host`` with host fault ``f`` applied."""
    kind = f.kind
    if kind == "refused":
        return replace(host, ip=REFUSED_IP)
    if kind == "nxdomain":
        return replace(host, dns="nxdomain")
    if kind == "dns_servfail":
        return replace(host, dns="servfail")
    if kind == "dns_timeout":
        return replace(host, dns="timeout")
    if kind == "dns_slow":
        return replace(host, dns="slow", dns_delay=f.num("delay"))
    if kind.startswith("robots_"):
        return replace(host, robots_fault=f)
    if kind == "bad_cert":
        if host.scheme != "https":
            raise ValueError(f"bad_cert needs an HTTPS host, {host.name} is plain HTTP")
        return replace(host, bad_cert=True)
    raise AssertionError(f"unhandled host fault {kind}")
