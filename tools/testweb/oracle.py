"""The oracle: what a correct crawler fetches, computed from the site, not a crawl.

Theory of operation: a breadth-first walk over ``Site.lookup`` answers.
A URL goes through the checks a crawler makes, in this order: scheme
(http/https only), scope, URL length, depth, then its host (DNS answer,
connection, certificate), then robots.txt, and only then it is fetched. A
fetched HTML page with status 200 contributes its links at depth + 1 (not
when it says nofollow and robots are obeyed); a redirect contributes its
Location at the same depth (or + 1, see ``redirects_add_depth``) and one
more redirect hop, up to ``max_redirects`` hops in a row. A page that is
rendered (``render``) also contributes its ``script_links`` at depth + 1, and
its ``subresources`` are requested (not walked: they are scripts and data).

A URL is fetched if *some* path of links reaches it within the limits (the
walk keeps every non-dominated (depth, hops) label per URL), which is what a
breadth-first crawler that tracks the smallest depth of a URL gets.

Assumptions about the crawler, each a documented choice:
- links are taken only from ``text/html`` / XHTML responses with status 200;
- 429/503 with Retry-After are retried until the real page comes (the
  fault's ``times``); slow first bytes and slow robots.txt are waited out;
- robots.txt: 4xx = allow all, 5xx = disallow all (RFC 9309), fetched once
  per host that has an admitted URL; meta robots / X-Robots-Tag ``nofollow``
  is obeyed together with robots.txt (``obey_robots``);
- rendering (``render``) runs every script of the page to its end in a
  browser that follows the crawler's rules: the links in the final DOM are
  ``links + script_links``; each subresource is requested once if its host
  is reachable and, obeying robots, its robots.txt allows it (so that
  robots.txt is fetched too); scope, depth and URL length do not apply to
  subresources; a nofollow page (obeying robots) adds neither. A page's
  script links need all its subresources (they come from ``app.js`` or
  ``data.json``): if one is blocked or unreachable, it adds none. Pages that
  never settle (endless loops, memory hogs) add no script links, and their
  server links are still followed. With ``render=False`` (the default) none
  of this happens: a plain crawler;
- sitemaps (``sitemaps``: "all", the crawler's default, "robots" or "off"):
  the first time a page URL of host H reaches the robots check (it passed
  scope, URL length and depth, and H is reachable; one robots.txt then
  blocks counts too, subresources do not), H's sitemaps are read, obeying
  robots or not (scope and robots.txt apply to sitemap files, depth and
  URL length do not). Candidates, in
  order, duplicates removed: the ``Sitemap:`` lines of H's robots.txt
  (obeying robots, "all" or "robots", robots.txt answered 200; field name
  in any case, anywhere in the file; resolved against the robots.txt URL),
  then (only "all") H's ``/sitemap.xml``; only those of H's origin (scheme,
  host, port), all at nesting level 0. Per host, first in first out, a
  candidate is requested iff it was not requested before in the crawl, H
  has requested fewer than ``MAX_SITEMAPS_PER_HOST``, its level is at most
  ``MAX_SITEMAP_NESTING`` and (obeying robots) robots.txt allows it. Only a
  final 200 gives something: its page entries of the sitemap's origin join
  the walk at depth 1, 0 hops, and go through every check as links do
  (scope, URL length, depth, robots, dedup); its child sitemaps of that
  origin become candidates at level + 1. A 3xx to the same origin makes
  its Location a candidate at the same level; anything else (other
  statuses, an HTML page, other origins' entries) gives nothing. What a
  file gives is ``Node.sitemap_urls`` / ``sitemap_children`` (what a
  crawler reads within its body limits, 10 MiB on the wire and 20 MiB
  decoded), of which the first ``MAX_SITEMAP_ENTRIES`` count. So every
  crawled host is asked for ``/sitemap.xml`` by default (a 404 on hosts
  without the ``sitemaps`` feature). A URL met at a larger depth before
  its sitemap came has depth 1 here, as for any shorter path: a crawler
  that keeps the first depth it met differs under ``max_depth``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import Host, Node
from .site import ROBOTS, Site
from .urls import normalize, origin, split

REDIRECTS = frozenset({301, 302, 303, 307, 308})
DEFAULT_MAX_REDIRECTS = 10
DEFAULT_LIMIT = 1_000_000  # fetched URLs before the walk calls the site infinite
# The crawler's sitemap limits.
MAX_SITEMAPS_PER_HOST = 64  # sitemap files requested per host, redirects included
MAX_SITEMAP_NESTING = 2  # index levels below the candidates of robots.txt and /sitemap.xml
MAX_SITEMAP_ENTRIES = 50_000  # entries of one file that count (the sitemaps.org limit)
SITEMAP_MODES = ("all", "robots", "off")
DEFAULT_SITEMAP = "/sitemap.xml"

Scope = Collection[str] | Callable[[str], bool] | None
Render = bool | Collection[str] | Callable[[str], bool]


class InfiniteSiteError(RuntimeError):
    """The walk passed ``limit`` URLs: a spider trap without ``max_depth``."""


@dataclass(frozen=True)
class CrawlResult:
    """Everything a correct crawl does, as canonical URLs."""

    fetched: frozenset[str]  # requested and answered over HTTP (any status)
    robots: frozenset[str]  # robots.txt URLs requested (obey_robots only)
    unreachable: frozenset[str]  # admitted, but the host gives no HTTP answer
    blocked: frozenset[str]  # disallowed by robots.txt
    out_of_scope: frozenset[str]
    too_deep: frozenset[str]
    too_long: frozenset[str]
    redirect_limit: frozenset[str]  # redirect targets past max_redirects hops
    depth: Mapping[str, int]  # smallest depth of each fetched URL
    status: Mapping[str, int]  # final status of each fetched URL
    faults: Mapping[str, str]  # fetched URL -> the fault kind it shows
    retries: Mapping[str, int]  # fetched URL -> 429/503 answers before the real one
    noindex: frozenset[str]  # fetched pages that say noindex
    crawl_delay: Mapping[str, float] = field(default_factory=dict)  # host -> Crawl-delay
    # Requested by the browser while rendering pages (render only): scripts, data.
    subresources: frozenset[str] = frozenset()
    # Sitemap files requested (redirecting ones too), and for each: the (url,
    # lastmod) page entries of its origin it gave, in file order; the child
    # sitemaps of its origin it listed; its nesting level (0: from robots.txt
    # or /sitemap.xml). () for a 404, a redirect or an HTML page.
    sitemaps: frozenset[str] = frozenset()
    sitemap_entries: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    sitemap_children: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sitemap_levels: Mapping[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> frozenset[str]:
        """Every URL the server sees at least once: pages, robots.txt, subresources, sitemaps."""
        return self.fetched | self.robots | self.subresources | self.sitemaps


class Oracle:
    """Answers questions about a :class:`Site`. Thread-safe (it keeps no state)."""

    def __init__(self, site: Site) -> None:
        self.site = site

    def describe(self, url: str) -> Node | None:
        """The Node served at ``url``; None if no server of the site answers it."""
        where = self.site.served_by(url)
        if where is None:
            return None
        host, target = where
        return self.site.lookup(host.name, target)

    def crawl(
        self,
        seeds: Iterable[str] | None = None,
        *,
        obey_robots: bool = True,
        scope: Scope = None,
        max_depth: int | None = None,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        max_url_length: int | None = None,
        redirects_add_depth: bool = False,
        user_agent: str = "*",
        render: Render = False,
        sitemaps: str = "all",
        cookies: bool = True,
        max_sitemaps_per_host: int | None = None,
        max_sitemap_nesting: int | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> CrawlResult:
        """The URLs a correct crawler fetches from ``seeds`` (default: the site's seed URL).

        ``scope`` is None (everything), a collection of host names, or a
        predicate on canonical URLs; seeds are checked like any other URL.
        ``render`` says which pages run their scripts: True (all), False
        (none), a collection of host names, or a predicate on canonical URLs.
        ``sitemaps``: "all" (robots.txt's Sitemap lines and /sitemap.xml),
        "robots" (the lines only) or "off"; the two limits default to the
        crawler's ``MAX_SITEMAPS_PER_HOST`` and ``MAX_SITEMAP_NESTING``.
        ``cookies``: the crawler keeps a cookie jar (its default), so a cookie wall
        gives its page.
        """
        if sitemaps not in SITEMAP_MODES:
            raise ValueError(f"sitemaps must be one of {SITEMAP_MODES}, not {sitemaps!r}")
        budget = MAX_SITEMAPS_PER_HOST if max_sitemaps_per_host is None else max_sitemaps_per_host
        nesting = MAX_SITEMAP_NESTING if max_sitemap_nesting is None else max_sitemap_nesting
        in_scope = _scope(scope)
        rendered = _render(render)
        site = self.site
        labels: dict[str, list[tuple[int, int]]] = {}
        queue: deque[tuple[str, int, int]] = deque()

        def push(url: str, depth: int, hops: int, front: bool = False) -> None:
            have = labels.setdefault(url, [])
            if any(d <= depth and h <= hops for d, h in have):
                return
            have[:] = [(d, h) for d, h in have if not (depth <= d and hops <= h)]
            have.append((depth, hops))
            (queue.appendleft if front else queue.append)((url, depth, hops))

        fetched: dict[str, int] = {}
        status: dict[str, int] = {}
        faults: dict[str, str] = {}
        retries: dict[str, int] = {}
        robots: set[str] = set()
        subresources: set[str] = set()
        crawl_delay: dict[str, float] = {}
        sets: dict[str, set[str]] = {k: set() for k in
                                     ("unreach", "blocked", "scope", "deep", "long", "redir")}
        noindex: set[str] = set()
        for seed in seeds if seeds is not None else [site.seed_url]:
            canon = normalize(seed)
            if canon is None:
                raise ValueError(f"seed {seed!r} is not an http(s) URL")
            push(canon, 0, 0)

        def robots_allow(host: str, target: str) -> bool:
            """Whether robots.txt lets ``target`` on ``host`` be fetched (records the fetch)."""
            if not obey_robots:
                return True
            robots.add(site.origin(host) + ROBOTS)
            rules = site.robots_rules(host, user_agent)
            if rules.crawl_delay is not None:
                crawl_delay[host] = rules.crawl_delay
            return rules.allowed(target)

        levels: dict[str, int] = {}  # requested sitemap -> level
        entries: dict[str, tuple[tuple[str, str], ...]] = {}
        children: dict[str, tuple[str, ...]] = {}
        per_host: dict[str, int] = {}
        discovered: set[str] = set()

        def discover(host: Host) -> None:
            """Read ``host``'s sitemaps (once): request them, push their entries."""
            if sitemaps == "off" or host.name in discovered:
                return
            discovered.add(host.name)
            here = site.origin(host.name)
            found = list(site.robots_sitemaps(host.name)) if obey_robots else []
            if sitemaps == "all":
                found.append(here + DEFAULT_SITEMAP)
            todo = deque((u, 0) for u in dict.fromkeys(found) if _origin(u) == here)
            while todo:
                url, level = todo.popleft()
                if url in levels or level > nesting or per_host.get(host.name, 0) >= budget:
                    continue
                if not in_scope(url):  # a crawler's URL rules apply to sitemap files too
                    continue
                t = split(url)
                assert t is not None
                if not robots_allow(host.name, t.target):
                    continue
                levels[url] = level
                per_host[host.name] = per_host.get(host.name, 0) + 1
                node = site.lookup(host.name, t.target)
                got: tuple[tuple[str, str], ...] = ()
                kids: tuple[str, ...] = ()
                if node.status in REDIRECTS and node.location is not None:
                    if _origin(node.location) == here:
                        todo.append((node.location, level))
                elif node.status == 200:
                    got = tuple(e for e in node.sitemap_urls[:MAX_SITEMAP_ENTRIES]
                                if _origin(e[0]) == here)
                    kids = tuple(k for k in node.sitemap_children[:MAX_SITEMAP_ENTRIES]
                                 if _origin(k) == here)
                entries[url], children[url] = got, kids
                for page, _ in got:
                    push(page, 1, 0)
                todo.extend((k, level + 1) for k in kids)

        def fetchable(sub: str) -> bool:
            """Whether the browser gets ``sub`` (reachable host, robots.txt allows it)."""
            where = site.served_by(sub)
            return where is not None and where[0].reachable and \
                robots_allow(where[0].name, where[1])

        while queue:
            url, depth, hops = queue.popleft()
            if not in_scope(url):
                sets["scope"].add(url)
                continue
            if max_url_length is not None and len(url) > max_url_length:
                sets["long"].add(url)
                continue
            if max_depth is not None and depth > max_depth:
                sets["deep"].add(url)
                continue
            where = site.served_by(url)
            if where is None or not where[0].reachable:
                sets["unreach"].add(url)
                continue
            host, target = where
            allowed = robots_allow(host.name, target)
            discover(host)  # the first page URL of a host to get here reads its sitemaps
            if not allowed:
                sets["blocked"].add(url)
                continue
            if url in fetched:
                fetched[url] = min(fetched[url], depth)
            else:
                fetched[url] = depth
                if len(fetched) > limit:
                    raise InfiniteSiteError(
                        f"more than {limit} URLs: a spider trap is reachable; set max_depth"
                    )
            node = site.lookup(host.name, target)
            if node.wall is not None and not cookies:
                node = node.wall
            status[url] = node.status
            if node.fault:
                faults[url] = node.fault
            if node.retries:
                retries[url] = node.retries
            if node.noindex:
                noindex.add(url)
            if node.status in REDIRECTS and node.location is not None:
                if hops + 1 > max_redirects:
                    sets["redir"].add(node.location)
                else:
                    add = 1 if redirects_add_depth else 0
                    push(node.location, depth + add, hops + 1, front=not add)
            elif node.status == 200 and node.html and not (obey_robots and node.nofollow):
                for link in node.links:
                    push(link, depth + 1, 0)
                if (node.script_links or node.subresources) and rendered(url):
                    got = [sub for sub in node.subresources if fetchable(sub)]
                    subresources.update(got)
                    if len(got) == len(node.subresources):  # the scripts need them all
                        for link in node.script_links:
                            push(link, depth + 1, 0)
        done = set(fetched)
        return CrawlResult(
            fetched=frozenset(done),
            robots=frozenset(robots),
            unreachable=frozenset(sets["unreach"] - done),
            blocked=frozenset(sets["blocked"] - done),
            out_of_scope=frozenset(sets["scope"]),
            too_deep=frozenset(sets["deep"] - done),
            too_long=frozenset(sets["long"]),
            redirect_limit=frozenset(sets["redir"] - done),
            depth=fetched,
            status=status,
            faults=faults,
            retries=retries,
            noindex=frozenset(noindex),
            crawl_delay=crawl_delay,
            subresources=frozenset(subresources),
            sitemaps=frozenset(levels),
            sitemap_entries=entries,
            sitemap_children=children,
            sitemap_levels=levels,
        )

    def sitemap_only(self, seeds: Iterable[str] | None = None, **kw: Any) -> frozenset[str]:
        """Pages fetched with sitemaps (``kw["sitemaps"]``, default "all") but not without."""
        seeds = list(seeds) if seeds is not None else None
        off = {**kw, "sitemaps": "off"}
        return self.crawl(seeds, **kw).fetched - self.crawl(seeds, **off).fetched


def _origin(url: str) -> str | None:
    """``scheme://host[:port]`` of a URL (None when it is not http(s))."""
    t = split(url)
    return None if t is None else origin(t.scheme, t.host, t.port)


def _scope(scope: Scope) -> Callable[[str], bool]:
    if scope is None:
        return lambda url: True
    if callable(scope):
        return scope
    hosts = {scope.lower()} if isinstance(scope, str) else {h.lower() for h in scope}

    def in_hosts(url: str) -> bool:
        t = split(url)
        return t is not None and t.host in hosts

    return in_hosts


def _render(render: Render) -> Callable[[str], bool]:
    if isinstance(render, bool):
        return lambda url: render
    return _scope(render)
