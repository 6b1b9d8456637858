"""Reading a crawl's MainDB without disturbing it: iterate, look up, list and show pages.

Theory of operation
-------------------
:class:`CrawlReader` opens ``DIR/main`` with ``kvstore.open(readonly=True)``
(a sharded crawl: every ``DIR/shard-NN/main``, read in shard order; one URL is
looked up in the shard owning its host, crawler.state.shards): no lock is
taken, so it works beside a running crawl and sees the records flushed
before it opened (a consistent snapshot; later pages are simply not there).
Iteration walks the store's key snapshot and decodes one record at a
time, so memory does not grow with the number of pages (the key snapshot
itself is kvstore's: 16 bytes a key). Records are yielded in store order, not
by fetch time.

A directory is a crawl if it has a shards.json or a ``main/``
(crawler.state.shards.crawl_count, the test every reading command makes); a shard
whose ``main/`` does not exist yet (it never ran) has no pages.

A damaged record (its CRC fails: ``CorruptStoreError``) or one that does not
decode as a page record is *skipped with a warning* (logged with its key and
the cause, counted in ``skipped``), because one bad record must not make a
whole crawl unreadable; with ``strict=True`` it raises ``DataDirError``
instead. ``python -m kvstore verify DIR/main`` reports every damaged record.
Without the body (``with_body=False``: rank, links, report, ``status --recount``)
only a record's first bytes are read (crawler.state.pages.read_page_head), and its
CRC, which covers the whole record, is checked only when they hold all of it: damage
in a body is then not seen (a garbled header or link section still fails to decode
where it would before); reading the body (pages, show, export) or ``verify`` finds it.

The rest is pure rendering: the ``python -m crawler pages`` line, what
``show`` prints, and :func:`visible_text` (JSONL ``--text``): lxml's HTML
parser driven with a *target* (no tree: nothing recurses and deep nesting
costs nothing, as in crawler.web.links) that keeps text outside script, style,
noscript and template, with a space at block boundaries, bounded per page.

Thread safety: a CrawlReader is for one thread (its counters are plain ints);
the formatting functions are pure.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial

import numpy as np

import kvstore

from ..exceptions import CrawlerError, DataDirError
from ..state.pages import PageRecord, decode_page, read_page_head
from ..state.shards import crawl_count, owner, shard_dir
from ..web.links import is_html, sniff_charset
from ..web.pagemeta import PageMeta, read_html
from ..web.urls import host_of, normalize, url_key
from .display import printable

log = logging.getLogger(__name__)

DEFAULT_PREVIEW_BYTES = 64  # bytes of a binary body shown in hex by ``show``
DEFAULT_MAX_TEXT_CHARS = 100_000  # visible text kept per page (JSONL --text)
_TEXT_TYPES = ("application/xhtml+xml", "application/xml", "application/json",
               "application/javascript", "application/ecmascript")
_SNIFF_BYTES = 1024


def absent_shards(data_dir: str, dirs: list[str]) -> list[int]:
    """The shards whose directory is not on this machine, said in a warning. (A crawl on
    Ray keeps each shard on its own node's disk: those shards are left out.)"""
    absent = [i for i, d in enumerate(dirs) if len(dirs) > 1 and not os.path.isdir(d)]
    if absent:
        log.warning(
            "%s: %d of %d shards are not on this machine (no %s): their pages are "
            "left out (a crawl on Ray: read each node's shards there, docs/RAY.md)",
            data_dir, len(absent), len(dirs), ", ".join(os.path.basename(dirs[i]) for i in absent),
        )
    return absent


class CrawlReader:
    """The page records of one crawl directory, read-only, every shard of it (in shard
    order). A context manager."""

    def __init__(self, data_dir: str | os.PathLike[str], *, strict: bool = False) -> None:
        self.data_dir = os.fspath(data_dir)
        self.strict = strict
        self.skipped = 0  # damaged records skipped so far
        count = crawl_count(self.data_dir)  # the one test of what a crawl directory is
        self.dirs = [shard_dir(self.data_dir, i, count) for i in range(count)]
        self.absent = absent_shards(self.data_dir, self.dirs)
        self.stores: list[kvstore.Store | None] = []  # None: a shard that never ran (or absent)
        try:
            for d in self.dirs:
                path = os.path.join(d, "main")
                self.stores.append(kvstore.open(path, readonly=True) if os.path.isdir(path)
                                   else None)
        except BaseException:
            self.close()
            raise
        self._names = [os.path.join(d, "main") for d in self.dirs]  # for messages

    @property
    def main(self) -> kvstore.Store:
        """The MainDB of a one-shard crawl (a sharded one has several: use ``stores``)."""
        if len(self.stores) != 1 or self.stores[0] is None:
            raise DataDirError(f"{self.data_dir}: {len(self.stores)} shards, no single MainDB")
        return self.stores[0]

    def __len__(self) -> int:
        """Records in the snapshot this reader opened (damaged ones included)."""
        return sum(len(s) for s in self.stores if s is not None)

    def close(self) -> None:
        for store in self.stores:
            if store is not None:
                store.close()

    def __enter__(self) -> CrawlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pages(self, *, with_body: bool = True) -> Iterator[PageRecord]:
        """Every readable page record, one at a time: shard by shard, in store order."""
        for i, store in enumerate(self.stores):
            if store is None:
                continue
            for key in store:
                page = self.load(i, key, with_body)
                if page is not None:
                    yield page

    def get(self, url: str) -> PageRecord | None:
        """The record of ``url`` (normalized first), from the shard owning its host;
        None if the crawl has none. A URL that cannot be normalized raises URLError."""
        normalized = normalize(url)
        i = owner(host_of(normalized), len(self.stores))
        store = self.stores[i]
        key = url_key(normalized)
        if store is None or key not in store:
            return None
        return self.load(i, key, True)

    def get_key(self, key: bytes, *, with_body: bool = True) -> PageRecord | None:
        """The record stored under the url_key ``key``; None if the crawl has none.
        (A key does not name its host: every shard's in-memory index is asked.)"""
        for i, store in enumerate(self.stores):
            if store is not None and key in store:
                return self.load(i, key, with_body)
        return None

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` (an (n, 16) uint8 array of url_keys) have a record: a bool
        array. In memory (the stores' key indexes), no disk access."""
        found = np.zeros(len(keys), dtype=bool)
        for store in self.stores:
            if store is not None:
                found |= store.contains_many(keys)
        return found

    def load(self, shard: int, key: bytes, with_body: bool = True) -> PageRecord | None:
        """The record of ``key`` in shard ``shard``; None if it has none or it is damaged
        (skipped with a warning; ``strict`` raises DataDirError)."""
        store = self.stores[shard]
        assert store is not None

        def read() -> PageRecord:
            if not with_body:  # the header and links only: the record's first KiBs
                return read_page_head(partial(store.get_prefix, key), with_links=True)
            return decode_page(store[key])

        page, damaged = load_record(read, self._names[shard], key, strict=self.strict)
        self.skipped += damaged
        return page


def load_record(read: Callable[[], PageRecord], name: str, key: bytes, *,
                strict: bool) -> tuple[PageRecord | None, bool]:
    """(``read()``, False); (None, False) for a key with no record; (None, True) for a
    damaged record, with a warning naming store ``name`` (``strict``: DataDirError)."""
    try:
        return read(), False
    except KeyError:  # cannot happen in MainDB (nothing is deleted), but harmless
        return None, False
    except (kvstore.exceptions.CorruptStoreError, CrawlerError, ValueError, TypeError,
            zlib.error) as exc:
        # ValueError covers bad JSON and UTF-8; TypeError unknown fields; zlib.error a bad body.
        message = f"{name}: record {key.hex()} is damaged: {exc}"
        if strict:
            raise DataDirError(message) from exc
        log.warning("%s (skipped)", message)
        return None, True


# -- pure formatting ----------------------------------------------------------------------


def iso_time(ts: float) -> str:
    """``2024-05-01T12:00:00.123456Z`` (UTC, microseconds) from a time.time() value."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def host_filter(value: str) -> str:
    """The form a ``--host`` value is compared in: lowercase, IDNA, ``host`` or
    ``host:port``. Raises URLError for a value that is not a host."""
    return normalize(f"http://{value.strip()}/").split("/")[2]


def matches(page: PageRecord, *, status: int | None = None, host: str | None = None) -> bool:
    """Whether a page passes the ``pages`` filters (``host`` as :func:`host_filter` gives)."""
    if status is not None and page.status != status:
        return False
    if host is not None:
        netloc = page.url.split("://", 1)[-1].split("/", 1)[0]
        if host != netloc and host != host_of(page.url):
            return False
    return True


def page_line(page: PageRecord) -> str:
    """One ``pages`` line: status, content type (or the outcome in brackets), body size, URL.
    What the server sent is shown escaped (crawler.read.display)."""
    kind = page.content_type or "-"
    if page.reason:
        kind = f"{kind} [{page.reason}]" if page.content_type else f"[{page.reason}]"
    return f"{page.status:3d}\t{printable(kind)}\t{len(page.body)}\t{printable(page.url)}"


def is_text(content_type: str, body: bytes) -> bool:
    """Whether a body is shown as text: a textual type, or no type and no NUL bytes."""
    mime = content_type.partition(";")[0].strip().lower()
    if mime:
        return (mime.startswith("text/") or mime in _TEXT_TYPES
                or mime.endswith(("+xml", "+json")))
    return b"\0" not in body[:_SNIFF_BYTES]


def body_text(page: PageRecord) -> str:
    """The body decoded by its charset (BOM, header, meta, else UTF-8), bad bytes replaced."""
    return page.body.decode(sniff_charset(page.content_type, page.body), "replace")


def describe(page: PageRecord, *, preview: int = DEFAULT_PREVIEW_BYTES) -> str:
    """What ``show`` prints: the fields, the headers as stored, then the body or a note;
    what the server sent escaped (crawler.read.display), a text body keeping its lines."""
    fields: list[tuple[str, object]] = [
        ("url", page.url), ("final_url", page.final_url), ("status", page.status),
        ("reason", page.reason), ("fetched_at", iso_time(page.fetched_at)), ("ip", page.ip),
        ("depth", page.depth), ("content_type", page.content_type),
        ("redirect", page.redirect), ("outlinks", page.outlinks),
        ("truncated", page.truncated), ("noindex", page.noindex),
        ("body_bytes", len(page.body)),
    ]
    lines = [f"{name + ':':<14}{printable(str(value))}" for name, value in fields]
    lines.append("headers:")
    lines += [f"  {printable(name)}: {printable(value)}" for name, value in page.headers.items()]
    lines.append("")
    if not page.body:
        lines.append("[no body stored]")
    elif is_text(page.content_type, page.body):
        lines.append(printable(body_text(page), keep="\n\t"))
    else:
        lines.append(f"[binary body: {len(page.body)} bytes; first {min(preview, len(page.body))}"
                     f" in hex: {page.body[:preview].hex()}; --body-only writes the bytes]")
    return "\n".join(lines)



def page_meta(page: PageRecord, *, limit: int = DEFAULT_MAX_TEXT_CHARS) -> PageMeta | None:
    """What the stored page says about itself (crawler.web.pagemeta): for HTML its text
    and head, for a text body its text alone; None for no body or a binary one. At most
    ``limit`` characters of text."""
    body = page.body
    if not body or not is_text(page.content_type, body):
        return None
    text = body.decode(sniff_charset(page.content_type, body), "replace").replace("\0", "\ufffd")
    if not is_html(page.content_type, body[:512]):
        return PageMeta(text=" ".join(text[: limit * 2].split())[:limit])
    return read_html(text.encode("utf-8"), page.url, text_limit=limit)


def visible_text(page: PageRecord, *, limit: int = DEFAULT_MAX_TEXT_CHARS) -> str | None:
    """The text a reader sees: HTML without scripts and styles, or a text body; None
    for a page with no body or a binary one. At most ``limit`` characters."""
    meta = page_meta(page, limit=limit)
    return None if meta is None else meta.text


__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "DEFAULT_PREVIEW_BYTES",
    "CrawlReader",
    "body_text",
    "describe",
    "host_filter",
    "load_record",
    "is_text",
    "iso_time",
    "matches",
    "page_line",
    "page_meta",
    "visible_text",
]
