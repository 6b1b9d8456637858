"""Page records (MainDB values) and pending entries (PendDB bulk lines): encode, decode.

A page record is every outcome of a URL: a fetched page (status 200 with its
body), a redirect, an HTTP error, or a failure with no response (status 0 and a
reason). Nothing is fetched twice because every outcome is recorded.

Record layout: ``b"KVCP"``, a u8 format version (1), a u32 LE header length,
the header as UTF-8 JSON, then the body compressed with zlib (possibly empty).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from ..exceptions import CrawlerError

_MAGIC = b"KVCP"
_VERSION = 1
_HEAD = struct.Struct("<4sBI")
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
    body: bytes = b""

    def header_dict(self) -> dict[str, Any]:
        """Every field but the body (a plain loop: dataclasses.asdict deep-copies, 10x slower)."""
        return {name: getattr(self, name) for name in _HEADER_FIELDS}


_HEADER_FIELDS = tuple(f.name for f in fields(PageRecord) if f.name != "body")


def encode_page(page: PageRecord, *, level: int = DEFAULT_COMPRESS_LEVEL) -> bytes:
    head = json.dumps(page.header_dict(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    body = zlib.compress(page.body, level) if page.body else b""
    return _HEAD.pack(_MAGIC, _VERSION, len(head)) + head + body


def decode_page(data: bytes, *, with_body: bool = True) -> PageRecord:
    if len(data) < _HEAD.size:
        raise CrawlerError(f"page record of {len(data)} bytes is too short")
    magic, version, hlen = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise CrawlerError(f"not a page record (magic {magic!r})")
    if version > _VERSION:
        raise CrawlerError(f"page record version {version} is newer than this crawler reads")
    head = json.loads(data[_HEAD.size : _HEAD.size + hlen])
    raw = data[_HEAD.size + hlen :]
    body = zlib.decompress(raw) if (with_body and raw) else b""
    return PageRecord(**head, body=body)


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


def decode_bulk(data: bytes) -> list[Pending]:
    out = []
    for line in data.decode("utf-8").split("\n"):
        if not line:
            continue
        depth, hops, attempts, url = line.split("\t", 3)
        out.append(Pending(url, int(depth), int(hops), int(attempts)))
    return out
