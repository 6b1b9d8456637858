"""What the site answers at one URL: the single description both the HTTP
server (which sends it) and the oracle (which reasons about it) read; and what the
page makers (hostile_pages, sitemapped, scripted, cookiewall) read of the site that
calls them (``SiteView``), so that none of them imports the site back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from random import Random
from typing import Any, Protocol

from .faults import Fault
from .urls import REFUSED_IP

HTML = "text/html; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # lowercase ASCII (IDNA) name
    scheme: str
    index: int | None  # graph host index; None for an extra host
    ip: str  # what its DNS name resolves to
    dns: str = "ok"  # ok | slow | servfail | timeout | nxdomain
    dns_delay: float = 0.0
    robots_fault: Fault | None = None
    bad_cert: bool = False

    @property
    def reachable(self) -> bool:
        """Whether a correct crawler gets HTTP answers from it at all."""
        return self.dns in ("ok", "slow") and self.ip != REFUSED_IP and not self.bad_cert


@dataclass(frozen=True, slots=True)
class Lazy:
    """A body made on first use by ``build(*args)`` (which caches it), for bodies
    that are slow to make (a gzip bomb): the oracle reads Nodes, never these bytes."""

    build: Callable[..., bytes]
    args: tuple[Any, ...] = ()

    def __call__(self) -> bytes:
        return self.build(*self.args)


@dataclass(frozen=True, slots=True)
class Node:
    status: int
    # For the oracle: canonical URLs a correct crawler extracts from the body
    # (empty unless it is a parsed HTML page), and the canonical redirect target.
    links: tuple[str, ...] = ()
    location: str | None = None
    html: bool = True  # a correct crawler parses it for links (by Content-Type)
    nofollow: bool = False  # meta robots / X-Robots-Tag nofollow
    noindex: bool = False
    fault: str | None = None  # the fault kind that shaped this answer
    retries: int = 0  # 429/503 answers sent before the real one (-1: forever)
    # Canonical URLs that appear in the DOM only after the page's scripts run
    # (a rendering crawler extracts them, a plain one does not; they need every
    # subresource), and those the browser requests while rendering it
    # (scripts, fetch()ed data).
    script_links: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    # A sitemap: what a correct crawler reads from this body within its limits
    # (the first 50,000 entries, 10 MiB on the wire, 20 MiB decoded), whatever
    # the bytes hold past them: (canonical page URL, lastmod as written or "")
    # of a urlset or text sitemap, canonical child sitemap URLs of an index.
    # Other origins included; the crawler drops those (the oracle does).
    sitemap_urls: tuple[tuple[str, str], ...] = ()
    sitemap_children: tuple[str, ...] = ()
    # For the server.
    content_type: str | None = HTML
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None  # None: a generated page (``page``) or a ``lazy`` one
    raw_location: str | None = None  # the Location header as sent (may be relative)
    page: int | None = None
    delivery: Fault | None = None  # a response fault the server applies while sending
    lazy: Lazy | None = None  # the body when ``body`` is None and it is no generated page
    # A cookie wall: the answer is this Node only to a request that sends the cookie
    # ``needs_cookie`` ("name=value"); without it the server sends ``wall`` instead (the
    # oracle too, for a crawler without cookies).
    needs_cookie: str | None = None
    wall: Node | None = None

    def but(self, **changes: object) -> Node:
        return replace(self, **changes)  # type: ignore[arg-type]


def text_node(status: int, text: str, *, fault: str | None = None) -> Node:
    """A small link-free page (404s, 500s, leaves)."""
    body = (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{status}</title></head><body><p>{text}</p></body></html>\n"
    ).encode()
    return Node(status, body=body, fault=fault)


NOT_FOUND = text_node(404, "Not found.")


class SiteView(Protocol):
    """What a page maker reads of the Site (tools.testweb.site) that calls it."""

    hosts: dict[str, Host]
    http_port: int
    https_port: int | None

    def origin(self, host: str) -> str: ...

    def url(self, host: str, target: str = "/") -> str: ...

    def body(self, host: str, node: Node) -> bytes: ...

    def rng(self, *salt: object) -> Random: ...
