"""Helpers for the testweb tests: a deliberately plain crawler.

``crawl_live`` fetches a running TestWeb over real sockets (requests through
the loopback adapter, names resolved by our DNS server with dnspython),
extracts links with lxml and normalizes them with its own small function.
It shares nothing with the oracle but the robots.txt matcher (tested on its
own in test_robots_txt.py), so oracle == crawl_live checks the site's HTML
against the site's description.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import lxml.html
import requests

from tools.testweb import client
from tools.testweb.harness import TestWeb
from tools.testweb.robots import ALLOW_ALL, DISALLOW_ALL, RobotsRules, parse

READ_LIMIT = 1 << 20  # bytes of a body the plain crawler reads at most
HTML_TYPES = ("text/html", "application/xhtml+xml")


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


def crawl_live(
    web: TestWeb,
    seeds: list[str] | None = None,
    *,
    obey_robots: bool = True,
    max_depth: int | None = None,
    scope: set[str] | None = None,
    max_redirects: int = 10,
    dns_lifetime: float = 1.0,
) -> LiveCrawl:
    """A breadth-first crawl with requests + lxml (slow, simple, obviously right)."""
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
    seen: set[str] = set()
    queue: deque[tuple[str, int, int]] = deque()
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
                    rules[origin] = _robots(session, origin, out)
                r = rules[origin]
                if r is None:
                    out.unreachable.add(url)
                    continue
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


def _robots(session: requests.Session, origin: str, out: LiveCrawl) -> RobotsRules | None:
    url = origin + "/robots.txt"
    resp = _get(session, url)
    if resp is None:
        return None
    out.robots.add(url)
    body = b"".join(_read(resp))
    if resp.status_code >= 500:
        return DISALLOW_ALL
    if resp.status_code >= 400:
        return ALLOW_ALL
    return parse(body.decode("utf-8", "replace"))


def _get(session: requests.Session, url: str) -> requests.Response | None:
    for _ in range(4):
        try:
            resp = session.get(url, allow_redirects=False, stream=True, timeout=(2, 10))
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
