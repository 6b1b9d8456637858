"""Helpers for the testweb tests: a deliberately plain crawler.

``crawl_live`` fetches a running TestWeb over real sockets (requests through
the loopback adapter, names resolved by our DNS server with dnspython),
extracts links with lxml and normalizes them with its own small function.
It shares nothing with the oracle but the robots.txt matcher (tested on its
own in test_robots_txt.py), so oracle == crawl_live checks the site's HTML
against the site's description. It reads sitemaps as the oracle's docstring
says a crawler does (robots.txt's Sitemap lines, /sitemap.xml, gzip, a
non-recovering XML parser, text sitemaps), with its own small reader and a
1 MiB body limit, so oracle == crawl_live also checks the sitemap files'
bytes against their Nodes.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import lxml.html
import requests
from lxml import etree

from tools.testweb import client
from tools.testweb.harness import TestWeb
from tools.testweb.robots import ALLOW_ALL, DISALLOW_ALL, RobotsRules, parse

READ_LIMIT = 1 << 20  # bytes of a body the plain crawler reads at most
HTML_TYPES = ("text/html", "application/xhtml+xml")
SITEMAP_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
MAX_SITEMAPS = 64  # per host
MAX_NESTING = 2
MAX_ENTRIES = 50_000  # per file
Entries = tuple[tuple[str, str], ...]


def plain_normalize(href: str, base: str) -> str | None:
    """urljoin, drop the fragment, lowercase scheme and host, IDNA, drop default port."""
    url = urljoin(base, href.strip())
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname.encode("idna").decode()
    port = parts.port
    scheme = parts.scheme.lower()
    if port and port != {"http": 80, "https": 443}[scheme]:
        host = f"{host}:{port}"
    path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    return urlunsplit((scheme, host, path, quote(parts.query, safe="/%:@!$&'()*+,;=-._~?"), ""))


@dataclass
class LiveCrawl:
    fetched: set[str] = field(default_factory=set)
    robots: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    status: dict[str, int] = field(default_factory=dict)
    # Sitemaps requested and answered -> their (url, lastmod) entries of their origin.
    sitemaps: dict[str, Entries] = field(default_factory=dict)
    sitemap_children: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def crawl_live(
    web: TestWeb,
    seeds: list[str] | None = None,
    *,
    obey_robots: bool = True,
    max_depth: int | None = None,
    scope: set[str] | None = None,
    max_redirects: int = 10,
    dns_lifetime: float = 1.0,
    sitemaps: str = "all",
) -> LiveCrawl:
    """A breadth-first crawl with requests + lxml (slow, simple, obviously right).

    ``sitemaps``: "all" (robots.txt's Sitemap lines and /sitemap.xml), "robots", "off".
    """
    out = LiveCrawl()
    resolver = client.dns_resolver(web.nameserver, lifetime=dns_lifetime)
    addresses: dict[str, str | None] = {}

    def resolve(name: str) -> str:
        if name not in addresses:
            try:
                addresses[name] = resolver(name)
            except requests.ConnectionError:
                addresses[name] = None
        ip = addresses[name]
        if ip is None:
            raise requests.ConnectionError(f"no address for {name}")
        return ip

    session = client.session(resolve, str(web.ca_file))
    rules: dict[str, RobotsRules | None] = {}
    lines: dict[str, list[str]] = {}  # origin -> its robots.txt's Sitemap values
    read: set[str] = set()  # origins whose sitemaps were read
    seen: set[str] = set()
    queue: deque[tuple[str, int, int]] = deque()

    def read_sitemaps(origin: str) -> None:
        """Request ``origin``'s sitemaps and queue their entries at depth 1."""
        found = []
        if obey_robots and sitemaps != "off":
            found = [plain_normalize(v, origin + "/robots.txt") for v in lines[origin]]
        if sitemaps == "all":
            found.append(origin + "/sitemap.xml")
        todo = deque((u, 0) for u in dict.fromkeys(found) if u and _origin(u) == origin)
        asked = 0
        while todo:
            url, level = todo.popleft()
            if url in out.sitemaps or level > MAX_NESTING or asked >= MAX_SITEMAPS:
                continue
            parts = urlsplit(url)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            r = rules.get(origin)
            if obey_robots and r is not None and not r.allowed(target):
                continue
            resp = _get(session, url)
            if resp is None:
                continue
            asked += 1
            got, kids, moved = _sitemap(resp, url)
            out.sitemaps[url] = tuple(e for e in got if _origin(e[0]) == origin)
            out.sitemap_children[url] = tuple(k for k in kids if _origin(k) == origin)
            if moved is not None and _origin(moved) == origin:
                todo.append((moved, level))
            todo.extend((k, level + 1) for k in out.sitemap_children[url])
            for page, _ in out.sitemaps[url]:
                if page not in seen:
                    seen.add(page)
                    queue.append((page, 1, 0))

    for s in seeds or [web.seed_url]:
        queue.append((plain_normalize(s, s) or s, 0, 0))
        seen.add(queue[-1][0])
    with session:
        while queue:
            url, depth, hops = queue.popleft()
            parts = urlsplit(url)
            if scope is not None and parts.hostname not in scope:
                continue
            if max_depth is not None and depth > max_depth:
                seen.discard(url)  # may come back at a smaller depth (never, in BFS order)
                continue
            origin = f"{parts.scheme}://{parts.netloc}"
            if obey_robots:
                if origin not in rules:
                    rules[origin], lines[origin] = _robots(session, origin, out)
                r = rules[origin]
                if r is None:
                    out.unreachable.add(url)
                    continue
            if sitemaps != "off" and origin not in read:
                read.add(origin)
                read_sitemaps(origin)
            if obey_robots:
                r = rules[origin]
                assert r is not None
                target = parts.path + (f"?{parts.query}" if parts.query else "")
                if not r.allowed(target):
                    continue
            resp = _get(session, url)
            if resp is None:
                out.unreachable.add(url)
                continue
            out.fetched.add(url)
            out.status[url] = resp.status_code
            found: list[tuple[str, int, int]] = []
            if resp.is_redirect and hops < max_redirects:
                loc = plain_normalize(resp.headers["Location"], url)
                if loc:
                    found.append((loc, depth, hops + 1))
            elif resp.status_code == 200 and _is_html(resp):
                body = b"".join(_read(resp))
                for link in _links(resp, body, url, obey_robots):
                    found.append((link, depth + 1, 0))
            resp.close()
            for item in found:
                if item[0] not in seen:
                    seen.add(item[0])
                    (queue.appendleft if item[2] else queue.append)(item)
    return out


def _robots(session: requests.Session, origin: str,
            out: LiveCrawl) -> tuple[RobotsRules | None, list[str]]:
    """The rules of ``origin``'s robots.txt (None: unreachable) and its Sitemap values."""
    url = origin + "/robots.txt"
    resp = _get(session, url)
    if resp is None:
        return None, []
    out.robots.add(url)
    text = b"".join(_read(resp)).decode("utf-8", "replace")
    if resp.status_code >= 500:
        return DISALLOW_ALL, []
    if resp.status_code >= 400:
        return ALLOW_ALL, []
    values = []
    for line in text.splitlines():
        key, colon, value = line.split("#", 1)[0].partition(":")
        if colon and key.strip().lower() == "sitemap" and value.strip():
            values.append(value.strip())
    return parse(text), values if resp.status_code == 200 else []


def _sitemap(resp: requests.Response,
             url: str) -> tuple[list[tuple[str, str]], list[str], str | None]:
    """A sitemap answer's (entries, child sitemaps, same-level redirect target)."""
    if resp.is_redirect:
        resp.close()
        return [], [], plain_normalize(resp.headers["Location"], url)
    if resp.status_code != 200:
        resp.close()
        return [], [], None
    body = b"".join(_read(resp))
    resp.close()
    if body[:2] == b"\x1f\x8b":  # gzip, whatever the headers say
        body = zlib.decompressobj(wbits=47).decompress(body, READ_LIMIT)
    ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype in HTML_TYPES:
        return [], [], None
    if ctype == "text/plain":
        found = (plain_normalize(line, url) for line in body.decode("utf-8", "replace").split("\n")
                 if urlsplit(line.strip()).scheme in ("http", "https"))
        return [(u, "") for u in found if u][:MAX_ENTRIES], [], None
    entries: list[tuple[str, str]] = []
    kids: list[str] = []
    loc = lastmod = ""
    parser = etree.XMLPullParser(events=("start", "end"))
    try:  # a non-recovering parser: whatever comes after an error is not read
        parser.feed(body)
        parser.close()
    except etree.XMLSyntaxError:
        pass
    for event, el in parser.read_events():
        if event == "start":
            if el.getparent() is None and el.tag not in (SITEMAP_NS + "urlset",
                                                         SITEMAP_NS + "sitemapindex"):
                return [], [], None
            continue
        name = el.tag.removeprefix(SITEMAP_NS)
        if name == "loc":
            loc = (el.text or "").strip()
        elif name == "lastmod":
            lastmod = (el.text or "").strip()
        elif name in ("url", "sitemap"):
            canon = plain_normalize(loc, url) if loc else None
            if canon is not None and name == "url":
                entries.append((canon, lastmod))
            elif canon is not None:
                kids.append(canon)
            loc = lastmod = ""
    return entries[:MAX_ENTRIES], kids[:MAX_ENTRIES], None


def _get(session: requests.Session, url: str) -> requests.Response | None:
    for _ in range(4):
        try:
            # No fault of the test web hangs for ever: the timeouts only bound a machine
            # that is busy (CI lost one page of a sitemap once with (2, 10)).
            resp = session.get(url, allow_redirects=False, stream=True, timeout=(10, 30))
        except (requests.ConnectionError, requests.Timeout):
            return None
        if resp.status_code in (429, 503) and "Retry-After" in resp.headers:
            resp.close()
            time.sleep(min(float(resp.headers["Retry-After"]), 0.05))
            continue
        return resp
    return resp


def _read(resp: requests.Response) -> list[bytes]:
    chunks, size = [], 0
    try:
        for chunk in resp.iter_content(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size >= READ_LIMIT:
                break
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
        pass
    return chunks


def _is_html(resp: requests.Response) -> bool:
    return resp.headers.get("Content-Type", "").split(";")[0].strip().lower() in HTML_TYPES


def _links(resp: requests.Response, body: bytes, url: str, obey_robots: bool) -> list[str]:
    if not body.strip():
        return []
    ctype = resp.headers.get("Content-Type", "")
    charset = ctype.split("charset=")[1].strip() if "charset=" in ctype else None
    parser = lxml.html.HTMLParser(encoding=charset) if charset else None
    try:
        doc = lxml.html.document_fromstring(body, parser=parser)
    except Exception:  # lxml refuses some binary bodies outright
        return []
    robots_tag = resp.headers.get("X-Robots-Tag", "").lower()
    meta = " ".join(m.get("content", "").lower()
                    for m in doc.iter("meta") if (m.get("name") or "").lower() == "robots")
    if obey_robots and any(w in robots_tag + " " + meta for w in ("nofollow", "none")):
        return []
    base = url
    for b in doc.iter("base"):
        if b.get("href") is not None:
            base = urljoin(url, b.get("href").strip())
            break
    out = []
    for a in doc.iter("a", "area"):
        href = a.get("href")
        if href is not None:
            link = plain_normalize(href, base)
            if link is not None:
                out.append(link)
    return out
