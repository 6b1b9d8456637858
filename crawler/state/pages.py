"""Page records (MainDB values) and pending entries (PendDB bulk lines): encode, decode.

A page record is every outcome of a URL: a fetched page (status 200 with its
body), a redirect, an HTTP error, or a failure with no response (status 0 and a
reason). Nothing is fetched twice because every outcome is recorded.

Record layout: ``b"KVCP"``, a u8 format version, a u32 LE header length, the
header as UTF-8 JSON, then (version 2) the outlinks: a u32 LE count ``n``, the
``n`` 16-byte url_keys of the link targets, then ``n`` flag bytes (bit 0:
nofollow), and last the body compressed with zlib (possibly empty). Version 1
records (written before outlinks were kept) have no link section and decode
with no links. Version 3 (written only for a page rendered in a browser, its render cut
or not) has, between the links and the body, a u32 LE length and the
rendered DOM compressed with zlib (length 0: no DOM); every other record is
still written as version 2, so a crawl without rendering stays readable by a
crawler that predates it (which refuses a version 3 record as newer). The
links are binary, beside the JSON, because a page has tens of them and they
are read in bulk (the link graph, PageRank): 17 bytes a link, sliced out
without parsing anything. The header and links come first so that a reader of
outcomes or links (retry, recrawl, status --recount, rank) reads a record's first
few KiB (``read_page_head`` over kvstore's ``get_prefix``), never its body.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from ..exceptions import CrawlerError, URLError
from ..web.urls import normalize, url_key, utf8_url_key

if TYPE_CHECKING:
    import kvstore

_MAGIC = b"KVCP"
_VERSION = 3
_VERSION_PLAIN = 2  # written when there is no rendered DOM
_HEAD = struct.Struct("<4sBI")
_COUNT = struct.Struct("<I")
KEY_SIZE = 16
LINK_SIZE = KEY_SIZE + 1  # a target key and its flag byte
NOFOLLOW = 1  # link flag: not followed because rel=nofollow or the page said nofollow
_UNLIMITED = 1 << 40  # a redirect target of any length still gets its key
DEFAULT_COMPRESS_LEVEL = 1  # speed over ratio: the crawl is CPU-bound long before disk-bound


@dataclass(frozen=True, slots=True)
class PageRecord:
    url: str
    status: int  # HTTP status, or 0 when no response was received
    fetched_at: float
    depth: int
    reason: str = (
        ""  # "" for a response; otherwise the failure class (dns_nxdomain, read_timeout...)
    )
    final_url: str = ""  # the URL that answered (same as url: redirects are separate records)
    ip: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = ""
    redirect: str = ""  # absolute Location of a 3xx
    outlinks: int = 0
    truncated: str = ""  # why the body was cut ("too_large", "decompression_bomb"), or ""
    noindex: bool = False
    elapsed: float | None = None  # seconds the fetch took (DNS included); None: not recorded
    # Every link of the page, each once: the followed ones first, then the nofollow
    # ones, each group in document order; pack_links() packing (n target keys, then n
    # flag bytes). Links not admitted (off scope, known) too.
    links: bytes = b""
    # Browser rendering (--render-js): "" not rendered, "ok", or why the render was cut
    # (render_timeout, render_crashed, ...; docs/RENDER.md). The links above then include
    # the links only the rendered DOM has; ``dom`` is that DOM, serialized.
    render: str = ""
    dom: bytes = b""
    # A recrawl (crawler.run.revisit): "not_modified" when the server answered a
    # conditional GET with 304, so the body (and links) are the earlier fetch's, made
    # at ``revisit_of`` (time.time()); "" otherwise.
    revisit: str = ""
    revisit_of: float = 0.0
    # start --revisit-after: seconds after ``fetched_at`` that the page is due again
    # (crawler.state.due says the rule); 0: not revisited.
    revisit_interval: float = 0.0
    # The protocols of the fetch, as WARC-Protocol names them: "h2 tls/1.3",
    # "http/1.1 tls/1.2"; "" for plain HTTP/1.1 (and records from before it was kept).
    protocol: str = ""
    # The Cookie header the page's request sent (from the crawl's jar); "" when none.
    cookie: str = ""
    body: bytes = b""

    def header_dict(self) -> dict[str, Any]:
        """Every field but the body and links (a plain loop: dataclasses.asdict deep-copies,
        10x slower)."""
        return {name: getattr(self, name) for name in _HEADER_FIELDS}

    def link_count(self) -> int:
        return len(self.links) // LINK_SIZE

    def link_keys(self) -> list[bytes]:
        """The target url_keys, in document order."""
        n = len(self.links) // LINK_SIZE
        kb = self.links
        return [kb[i : i + KEY_SIZE] for i in range(0, n * KEY_SIZE, KEY_SIZE)]

    def link_list(self) -> list[tuple[bytes, int]]:
        """(target url_key, flags) of every link, in document order."""
        n = len(self.links) // LINK_SIZE
        return list(zip(self.link_keys(), self.links[n * KEY_SIZE :], strict=True))

    def redirect_key(self) -> bytes | None:
        """The url_key of a redirect's target (its Location normalized as the crawler
        does), or None: not a redirect, or a Location that is no crawlable URL."""
        if not self.redirect or not 300 <= self.status < 400:
            return None
        try:
            return url_key(normalize(self.redirect, max_length=_UNLIMITED))
        except URLError:
            return None


_HEADER_FIELDS = tuple(f.name for f in fields(PageRecord) if f.name not in ("body", "links", "dom"))
_OPTIONAL_FIELDS = ("render", "revisit", "revisit_of", "revisit_interval", "protocol",
                    "cookie")


def pack_links(follow: Iterable[str], nofollow: Iterable[str] = (), *,
               page_nofollow: bool = False, follow_keys: list[bytes] | None = None) -> bytes:
    """The ``links`` of a record: normalized URLs to follow and ones marked
    nofollow (rel=nofollow); ``page_nofollow`` marks every link (the page said
    nofollow). A URL is kept once (its first flag wins); callers pass unique URLs.
    ``follow_keys``: the url_key of each of ``follow``, if the caller has them."""
    keys = [url_key(u) for u in follow] if follow_keys is None else list(follow_keys)
    n_follow = len(keys)
    keys += [url_key(u) for u in nofollow]
    if not keys:
        return b""
    if page_nofollow:
        flags = bytes([NOFOLLOW]) * len(keys)
    else:
        flags = bytes(n_follow) + bytes([NOFOLLOW]) * (len(keys) - n_follow)
    if len(set(keys)) != len(keys):  # rare: keep the first of each key
        seen: dict[bytes, int] = {}
        for k, f in zip(keys, flags, strict=True):
            seen.setdefault(k, f)
        keys, flags = list(seen), bytes(seen.values())
    return b"".join(keys) + flags


def encode_page(page: PageRecord, *, level: int = DEFAULT_COMPRESS_LEVEL) -> bytes:
    header = page.header_dict()
    # Fields most records leave empty are written only when set, so a record without
    # them stays readable by a crawler that predates them.
    for name in _OPTIONAL_FIELDS:
        if not header[name]:
            del header[name]
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body = zlib.compress(page.body, level) if page.body else b""
    if len(page.links) % LINK_SIZE:
        raise CrawlerError(f"links of {len(page.links)} bytes: not a pack_links() value")
    links = _COUNT.pack(len(page.links) // LINK_SIZE) + page.links
    if not page.render:
        return _HEAD.pack(_MAGIC, _VERSION_PLAIN, len(head)) + head + links + body
    dom = zlib.compress(page.dom, level) if page.dom else b""
    return (_HEAD.pack(_MAGIC, _VERSION, len(head)) + head + links
            + _COUNT.pack(len(dom)) + dom + body)


def decode_page(data: bytes, *, with_body: bool = True) -> PageRecord:
    if len(data) < _HEAD.size:
        raise CrawlerError(f"page record of {len(data)} bytes is too short")
    magic, version, hlen = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise CrawlerError(f"not a page record (magic {magic!r})")
    if version > _VERSION:
        raise CrawlerError(f"page record version {version} is newer than this crawler reads")
    end = _HEAD.size + hlen
    head = json.loads(data[_HEAD.size : end])
    links = b""
    if version >= 2:
        if len(data) < end + _COUNT.size:
            raise CrawlerError("page record is cut in its link section")
        (n,) = _COUNT.unpack_from(data, end)
        links = data[end + _COUNT.size : end + _COUNT.size + n * LINK_SIZE]
        if len(links) != n * LINK_SIZE:
            raise CrawlerError("page record is cut in its link section")
        end += _COUNT.size + n * LINK_SIZE
    dom = b""
    if version >= 3:
        if len(data) < end + _COUNT.size:
            raise CrawlerError("page record is cut in its DOM section")
        (n,) = _COUNT.unpack_from(data, end)
        end += _COUNT.size
        if len(data) < end + n:
            raise CrawlerError("page record is cut in its DOM section")
        if with_body and n:
            dom = zlib.decompress(data[end : end + n])
        end += n
    raw = data[end:]
    body = zlib.decompress(raw) if (with_body and raw) else b""
    return PageRecord(**head, links=links, dom=dom, body=body)


def decode_page_head(prefix: bytes, *, with_links: bool = False) -> PageRecord | int:
    """The record whose first bytes are ``prefix``, without its body and DOM (empty), and
    without its links unless ``with_links``; or, when ``prefix`` is too short to hold
    those, the number of bytes it needs (an int: ask for that many and call again). The
    JSON header's length is in the fixed head, the link count after the header, so at
    most two reads are needed. Raises CrawlerError (or ValueError, TypeError for a bad
    header) as decode_page does."""
    if len(prefix) < _HEAD.size:
        return _HEAD.size
    magic, version, hlen = _HEAD.unpack_from(prefix)
    if magic != _MAGIC:
        raise CrawlerError(f"not a page record (magic {magic!r})")
    if version > _VERSION:
        raise CrawlerError(f"page record version {version} is newer than this crawler reads")
    end = _HEAD.size + int(hlen)
    links_at = need = end
    if with_links and version >= 2:
        need = end + _COUNT.size
        if len(prefix) >= need:
            (n,) = _COUNT.unpack_from(prefix, end)
            links_at, need = need, need + int(n) * LINK_SIZE
    if len(prefix) < need:
        return need
    head = json.loads(prefix[_HEAD.size : end])
    return PageRecord(**head, links=prefix[links_at:need])


# A record's first read: one page (seedscale's header and links: 0.9 KB median, 1.2 KB max);
# half that without the links (its JSON header alone: ~0.4 KB).
HEAD_READ = 4096
HEADER_READ = 2048


def read_page_head(read: Callable[[int], bytes], *, with_links: bool = False,
                   first: int | None = None) -> PageRecord:
    """decode_page_head over ``read(n)``, the first ``n`` bytes of a record (all of it if
    shorter: kvstore's ``Store.get_prefix``): one read of ``first`` bytes (HEAD_READ with
    the links, else HEADER_READ), a second only for a record whose header (and links) are
    longer. Raises CrawlerError for a record shorter than its own head says."""
    if first is None:
        first = HEAD_READ if with_links else HEADER_READ
    data = read(first)
    page = decode_page_head(data, with_links=with_links)
    if isinstance(page, int) and len(data) >= first:  # more of the record is there
        data = read(page)
        page = decode_page_head(data, with_links=with_links)
    if isinstance(page, int):
        raise CrawlerError(f"page record of {len(data)} bytes is cut in its header or links "
                           f"(they end at byte {page})")
    return page


class Pending(NamedTuple):
    """A URL waiting in PendDB: where it came from and how often it was tried.
    (A NamedTuple: one is made per link found, and a frozen dataclass costs 4x more.)"""

    url: str
    depth: int = 0
    hops: int = 0  # redirects followed to reach it
    attempts: int = 0  # failed tries so far (transient errors)

    def line(self) -> str:
        return f"{self.depth}\t{self.hops}\t{self.attempts}\t{self.url}"


def encode_bulk(entries: list[Pending]) -> bytes:
    """A PendDB value: one tab-separated line per URL (normalized URLs hold no tabs)."""
    return "\n".join(e.line() for e in entries).encode("utf-8")


def bulk_key(counter: int) -> bytes:
    """PendDB's key of a bulk: its counter, 16 bytes big-endian."""
    return counter.to_bytes(16, "big")


def bulk_counter(key: bytes) -> int:
    """The counter a PendDB key holds (``bulk_key``'s inverse)."""
    return int.from_bytes(key, "big")


def put_bulks(pend: kvstore.Store, entries: list[Pending], counter: int,
              size: int) -> tuple[list[bytes], int]:
    """``entries`` put into PendDB as bulks of ``size``, keyed by counters from ``counter``
    on (not flushed: the caller's commit order says when): (their keys, the next
    counter). The one writer of PendDB's layout: the frontier, the retry and the
    reshard use it."""
    keys = [bulk_key(counter + i) for i in range((len(entries) + size - 1) // size)]
    if keys:
        pend.put_many(keys, [encode_bulk(entries[i : i + size])
                             for i in range(0, len(entries), size)])
    return keys, counter + len(keys)


def bulk_keys(data: bytes) -> bytes:
    """The url_keys of a bulk's URLs, joined (16 bytes each), read from its bytes: no
    text decoded, no Pending made (a third of decode_bulk's time, 0.65 us a URL: a
    frontier's open reads 14M of them)."""
    return b"".join([utf8_url_key(line.rpartition(b"\t")[2])
                     for line in data.split(b"\n") if line])


def bulk_depths(data: bytes) -> list[int]:
    """The depths of a bulk's URLs, in bulk_keys' order."""
    return [int(line.partition(b"\t")[0]) for line in data.split(b"\n") if line]


def decode_bulk(data: bytes) -> list[Pending]:
    out = []
    for line in data.decode("utf-8").split("\n"):
        if not line:
            continue
        depth, hops, attempts, url = line.split("\t", 3)
        out.append(Pending(url, int(depth), int(hops), int(attempts)))
    return out
