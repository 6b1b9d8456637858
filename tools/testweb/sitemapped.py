"""The ``sitemaps`` feature: pages only sitemaps reach, and sitemap files that
are hard to read right.

Everything lives under ``/x/sitemaps/`` on the fault's host, plus that host's
``/sitemap.xml`` and four ``Sitemap:`` lines added to its robots.txt. The hub
entry ``/x/sitemaps/`` is an ordinary HTML page that links one leaf
(``linked.html``, which ``/sitemap.xml`` lists too); no page links any file
here or any ``only/<name>.html`` page, so those pages are fetched only by a
crawler that reads sitemaps. Each such page has a distinct name, so a test
can tell which file admitted it.

Each file's Node says what a correct crawler reads from it
(``Node.sitemap_urls``, ``Node.sitemap_children``), so the oracle never
parses these bytes. The hostile files are built so that no crawler limit is
close to an entry: entries sit in the first KB, or after 100 MiB of padding
(past any decoded-size limit), or after a syntax error (which a parser that
does not "recover" stops at). ``huge.xml`` is streamed by the server like the
``huge_body`` fault (its head, then padding to 1 GiB; never held in
memory); ``bomb.xml.gz`` is built once on first request, in 1 MiB pieces.
Padding is whitespace with an empty comment every 64 KiB, so no text node
comes near libxml2's 10,000,000-byte limit (lxml without ``huge_tree``
fails there, just below a 10 MiB body limit): the body limits are what cut.

"Another host" is ``h1.test`` (``h0.test`` when the feature is on h1); its
files are never requested from this host's sitemaps, and its only/ pages are
served only if that host has the feature too.
"""

from __future__ import annotations

import gzip
import zlib
from functools import lru_cache
from html import escape

from .faults import Fault, fault
from .model import HTML, NOT_FOUND, Lazy, Node, SiteView
from .render import leaf_page, link_list
from .urls import origin

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
ROOT = "/sitemap.xml"  # the default sitemap every crawled host is asked for
XML = "application/xml"
GZIP = "application/gzip"
TEXT = "text/plain; charset=utf-8"
HUGE_SIZE = 1 << 30  # huge.xml, bytes on the wire
BOMB_PADDING = 100 << 20  # padding before bomb.xml.gz's entry, once decoded
PAD_COMMENT = b"<!-- -->\n"  # ends each padding block: text nodes stay small
PAD_BLOCK = 64 * 1024
LINKED = "linked.html"  # the hub's one link, also in /sitemap.xml
HUGE = fault("huge_body", size=HUGE_SIZE)  # how the server streams huge.xml

# urlset files: name -> [(path under the mount, lastmod)] (the paths on this host).
URLSETS: dict[str, list[tuple[str, str]]] = {
    "sitemap.xml": [("only/root-1.html", "2024-01-01"),
                    ("only/root-2.html", "2024-01-02T12:00:00+00:00"),
                    (LINKED, "2024-01-03")],
    "lower.xml": [("only/lower.html", "2024-02-01")],
    "urlset.xml.gz": [("only/gz-1.html", "2024-03-01"), ("only/gz-2.html", "")],
    "deep.xml": [("only/deep.html", "")],
    "toodeep.xml": [("only/toodeep.html", "")],
    "huge.xml": [("only/huge-1.html", "2024-04-01"), ("only/huge-2.html", "")],
    "moved-to.xml": [("only/moved.html", "")],
    "foreign.xml": [("only/foreign.html", "")],
    "away-to.xml": [("only/away.html", "")],
}
# index files: name -> children (names under the mount; "@name": on the other host).
INDEXES: dict[str, list[str]] = {
    "index.xml": ["index.xml", "urlset.xml.gz", "nested.xml", "bomb.xml.gz", "huge.xml",
                  "garbage.xml", "offhost.xml", "notasitemap.xml", "missing.xml", "moved.xml",
                  "away.xml", "@foreign.xml"],
    "nested.xml": ["deep.xml", "deeper.xml"],
    "deeper.xml": ["toodeep.xml"],
}
TEXT_PAGES = ["only/text-1.html", "only/text-2.html"]
TEXT_JUNK = "junk: this line is not a URL"  # another scheme however it is resolved
GARBAGE = ("only/garbage-a.html", "only/garbage-b.html")  # before / after the error
BOMB_PAGE = "only/bomb.html"
NOT_A_SITEMAP_LINK = "only/notasitemap.html"
OFFHOST_HERE = "only/offhost.html"
OFFHOST_OTHER = ["only/offhost-other-1.html", "only/offhost-other-2.html"]  # other host
OFFHOST_SCHEME = "only/offhost-scheme.html"  # this host name, the other scheme

ONLY = sorted(
    {p for e in URLSETS.values() for p, _ in e if p.startswith("only/")}
    | set(TEXT_PAGES) | set(GARBAGE) | set(OFFHOST_OTHER)
    | {BOMB_PAGE, NOT_A_SITEMAP_LINK, OFFHOST_HERE, OFFHOST_SCHEME}
)


def other_host(site: SiteView, host: str) -> str | None:
    """The other host of the site that foreign entries point at (None: there is none)."""
    for name in ("h1.test", "h0.test"):
        if name != host and name in site.hosts:
            return name
    return None


def _other(site: SiteView, f: Fault, host: str, rest: str) -> str:
    name = other_host(site, host)
    if name is None:  # a one-host site: a name nothing serves
        return origin("http", "elsewhere.test", site.http_port) + f.mount + rest
    return site.url(name, f.mount + rest)


def robots_lines(site: SiteView, f: Fault, host: str) -> str:
    """The Sitemap lines added to ``host``'s robots.txt (absolute, relative, off-host, lower)."""
    m = f.mount
    return (
        "\n# testweb sitemaps\n"
        f"Sitemap: {site.url(host, m + 'index.xml')}\n"
        f"Sitemap: {m}plain.txt\n"
        f"Sitemap: {_other(site, f, host, 'foreign.xml')}\n"
        f"sitemap: {site.url(host, m + 'lower.xml')}\n"
    )


def padding(size: int) -> bytes:
    """``size`` bytes of XML padding: spaces, each ``PAD_BLOCK`` ending in a comment."""
    block = b" " * (PAD_BLOCK - len(PAD_COMMENT)) + PAD_COMMENT
    return (block * (size // PAD_BLOCK + 1))[:size]


def urlset_xml(entries: list[tuple[str, str]]) -> bytes:
    rows = "".join(
        f"  <url><loc>{escape(u)}</loc>" + (f"<lastmod>{m}</lastmod>" if m else "") + "</url>\n"
        for u, m in entries
    )
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}">\n{rows}'
            "</urlset>\n").encode()


def index_xml(children: list[str]) -> bytes:
    rows = "".join(f"  <sitemap><loc>{escape(u)}</loc></sitemap>\n" for u in children)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{NS}">\n{rows}'
            "</sitemapindex>\n").encode()


@lru_cache(maxsize=8)
def bomb(entry: str) -> bytes:
    """gzip of ``<urlset>``, ``BOMB_PADDING`` of padding, one ``<url>`` (``entry``), ``</urlset>``.

    Compressed one 1 MiB block at a time, so building it holds ~100 KB, not 100 MiB.
    """
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip member, mtime 0
    head, tail = urlset_xml([(entry, "")]).split(b"  <url>")
    parts = [comp.compress(head)]
    block = padding(1 << 20)
    for _ in range(BOMB_PADDING // len(block)):
        parts.append(comp.compress(block))
    parts += [comp.compress(b"  <url>" + tail), comp.flush()]
    return b"".join(parts)


def _garbage(a: str, b: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}">\n'
        f"  <url><loc>{escape(a)}</loc></url>\n"
        "<<< &&& \x01\x02 stray ]]> bytes: not XML\n"
        f"  <url><loc>{escape(b)}</loc></url>\n</urlset>\n"
    ).encode()


def _urlset(entries: list[tuple[str, str]], content_type: str = XML) -> Node:
    return Node(200, html=False, content_type=content_type, body=urlset_xml(entries),
                sitemap_urls=tuple(entries))


def root(site: SiteView, f: Fault, host: str) -> Node:
    """``/sitemap.xml`` of the feature's host."""
    return _urlset([(site.url(host, f.mount + p), m) for p, m in URLSETS["sitemap.xml"]])


def sitemaps(site: SiteView, f: Fault, host: str, rest: str) -> Node:
    """What ``/x/sitemaps/<rest>`` answers on ``host``."""
    m = f.mount

    def here(path: str) -> str:
        return site.url(host, m + path)

    if rest == "":
        return Node(200, links=(here(LINKED),), body=link_list("sitemaps", [LINKED]))
    if rest == LINKED or rest in ONLY:
        return Node(200, body=leaf_page(f"sitemaps {rest}"))
    if rest in URLSETS and rest != "sitemap.xml":
        entries = [(here(p), lm) for p, lm in URLSETS[rest]]
        if rest == "urlset.xml.gz":
            body = gzip.compress(urlset_xml(entries), mtime=0)
            return Node(200, html=False, content_type=GZIP, body=body,
                        sitemap_urls=tuple(entries))
        if rest == "huge.xml":
            head = urlset_xml(entries).removesuffix(b"</urlset>\n")
            return Node(200, html=False, content_type=XML, body=head, delivery=HUGE,
                        sitemap_urls=tuple(entries))
        if rest == "lower.xml":
            return _urlset(entries, "text/xml; charset=utf-8")
        return _urlset(entries)
    if rest in INDEXES:
        kids = [_other(site, f, host, k[1:]) if k.startswith("@") else here(k)
                for k in INDEXES[rest]]
        return Node(200, html=False, content_type=XML, body=index_xml(kids),
                    sitemap_children=tuple(kids))
    if rest == "plain.txt":
        urls = [here(p) for p in TEXT_PAGES]
        body = "\n".join([*urls, "", TEXT_JUNK, ""]).encode()
        return Node(200, html=False, content_type=TEXT, body=body,
                    sitemap_urls=tuple((u, "") for u in urls))
    if rest == "garbage.xml":
        a, b = here(GARBAGE[0]), here(GARBAGE[1])
        return Node(200, html=False, content_type=XML, body=_garbage(a, b),
                    sitemap_urls=((a, ""),))  # a parser stops at the error: never b
    if rest == "bomb.xml.gz":
        # Its one entry lies past 100 MiB decoded: past the crawler's limit, so none.
        return Node(200, html=False, content_type=GZIP, lazy=Lazy(bomb, (here(BOMB_PAGE),)))
    if rest == "offhost.xml":
        t = site.hosts[host]
        other_scheme = "https" if t.scheme == "http" else "http"
        port = site.https_port if other_scheme == "https" else site.http_port
        entries = [(_other(site, f, host, p), "") for p in OFFHOST_OTHER]
        entries.append((origin(other_scheme, host, port or 443) + m + OFFHOST_SCHEME, ""))
        entries.append((here(OFFHOST_HERE), ""))
        return _urlset(entries)
    if rest == "notasitemap.xml":
        return Node(200, links=(here(NOT_A_SITEMAP_LINK),), content_type=HTML,
                    body=link_list("not a sitemap", [NOT_A_SITEMAP_LINK]))
    if rest == "moved.xml":
        return Node(301, location=here("moved-to.xml"), raw_location="moved-to.xml",
                    html=False, body=b"")
    if rest == "away.xml":
        loc = _other(site, f, host, "away-to.xml")
        return Node(302, location=loc, raw_location=loc, html=False, body=b"")
    return NOT_FOUND
