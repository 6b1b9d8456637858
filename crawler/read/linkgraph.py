"""A page's outlinks and inlinks, read from the page records (``python -m crawler links``).

Theory of operation
-------------------
Every page record carries its outlinks (crawler.state.pages: the target
url_keys and a nofollow flag, every link of the page once, admitted or not),
and a redirect's record its Location, whose key the reader derives
(``PageRecord.redirect_key``). So:

- *outlinks* of a page come from its own record; a target's URL is *known*
  when the crawl has a record for it (one lookup by key), else only its key is;
- *inlinks* of a URL are found by one streaming pass over every record,
  looking for its key among their links (``bytes.find`` on the packed keys, at
  16-byte boundaries) and their redirect targets. Memory stays flat (one record
  at a time); time is one read of the crawl;
- *inlink counts* for every recorded page (``pages --inlinks``) take one pass
  too: per batch of records, the targets that have a record are counted into a
  :class:`kvstore.KeyIntMap` (about 30 bytes per recorded page, like the
  MainDB index the reader already holds).

:class:`Resolver` turns target keys into URLs for the exports, a batch at a
time: the rank store's URL table when there is one (crawler.read.rankstore: one
vectorized search of its mapped key index), then MainDB's in-memory indexes for
the keys it lacks (at once), and a header read, behind a bounded LRU cache, only
for a key recorded since the rank run. A page has ~20 links at scale, so export
spends most of its time here.

Thread safety: for one thread, like the CrawlReader underneath.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

import kvstore

from ..state.pages import KEY_SIZE, LINK_SIZE, NOFOLLOW, PageRecord
from ..web.urls import url_key
from .listing import CrawlReader
from .rankstore import RankStore

log = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 1 << 16  # resolved keys kept by a Resolver
_COUNT_BATCH = 1 << 16  # link keys counted per vectorized step


@dataclass(frozen=True, slots=True)
class Link:
    """One edge seen from one end: the other end's key and, when known, its URL."""

    key: bytes
    url: str | None  # None: the crawl has no record of that URL
    nofollow: bool = False
    redirect: bool = False  # the edge is a redirect (Location), not an <a href>
    status: int | None = None  # the other end's status, when it has a record

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"url": self.url} if self.url is not None else {
            "key": self.key.hex()}
        out["nofollow"] = self.nofollow
        if self.redirect:
            out["redirect"] = True
        if self.status is not None:
            out["status"] = self.status
        return out


def link_position(links: bytes, key: bytes) -> int:
    """Index of ``key`` among the packed target keys of ``links``, or -1."""
    end = (len(links) // LINK_SIZE) * KEY_SIZE
    i = links.find(key, 0, end)
    while i >= 0 and i % KEY_SIZE:
        i = links.find(key, i + 1, end)
    return -1 if i < 0 else i // KEY_SIZE


def outlinks(reader: CrawlReader, page: PageRecord) -> list[Link]:
    """The page's links in document order (its redirect target first, for a redirect),
    each with its target's URL and status when the crawl has a record of it."""
    edges = [(k, bool(f & NOFOLLOW), False) for k, f in page.link_list()]
    target = page.redirect_key()
    if target is not None:
        edges.insert(0, (target, False, True))
    out = []
    for key, nofollow, redirect in edges:
        rec = reader.get_key(key, with_body=False)
        out.append(Link(key, rec.url if rec else None, nofollow, redirect,
                        rec.status if rec else None))
    if target is not None and out[0].url is None:  # the record itself names its target
        out[0] = Link(target, page.redirect, False, True, None)
    return out


def inlinks(reader: CrawlReader, key: bytes) -> Iterator[Link]:
    """Every record that links (or redirects) to ``key``, in store order: one pass."""
    for page in reader.pages(with_body=False):
        i = link_position(page.links, key)
        if i >= 0:
            n = page.link_count()
            flags = page.links[n * KEY_SIZE + i]
            yield Link(_key_of(page), page.url, bool(flags & NOFOLLOW), False, page.status)
        elif page.redirect and page.redirect_key() == key:
            yield Link(_key_of(page), page.url, False, True, page.status)


def _key_of(page: PageRecord) -> bytes:
    return url_key(page.url)


def page_targets(page: PageRecord) -> bytes:
    """The packed keys of every edge leaving ``page``: its links, then its redirect."""
    keys = page.links[: page.link_count() * KEY_SIZE]
    target = page.redirect_key()
    return keys + target if target is not None else keys


def inlink_counts(reader: CrawlReader) -> kvstore.KeyIntMap:
    """url_key -> number of records linking or redirecting to it, for every target
    that has a record (links to URLs the crawl never recorded are not counted)."""
    counts = kvstore.KeyIntMap(capacity=max(len(reader), 1))
    parts: list[bytes] = []
    size = 0
    for page in reader.pages(with_body=False):
        keys = page_targets(page)
        if keys:
            parts.append(keys)
            size += len(keys)
        if size >= _COUNT_BATCH * KEY_SIZE:
            _count(reader, counts, b"".join(parts))
            parts, size = [], 0
    if parts:
        _count(reader, counts, b"".join(parts))
    return counts


def _count(reader: CrawlReader, counts: kvstore.KeyIntMap, packed: bytes) -> None:
    keys = np.frombuffer(packed, dtype=np.uint8).reshape(-1, KEY_SIZE)
    keys = keys[reader.contains_many(keys)]
    if not len(keys):
        return
    uniq, n = np.unique(keys.view(f"V{KEY_SIZE}").ravel(), return_counts=True)
    uniq = uniq.view(np.uint8).reshape(-1, KEY_SIZE)
    have = counts.get_many(uniq, default=0)
    counts.put_many(uniq, have + n)


class Resolver:
    """url_key -> URL (None when the crawl has no record of it).

    ``ranks`` (the rank store) is the fast table asked first; MainDB, through the
    reader, answers what it does not know (pages recorded since the rank run), behind
    a bounded LRU cache: each of those answers is a read of a record's header."""

    def __init__(self, reader: CrawlReader, *, ranks: RankStore | None = None,
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.reader = reader
        self.ranks = ranks
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, str | None] = OrderedDict()

    def __call__(self, key: bytes) -> str | None:
        return self.many(np.frombuffer(key, dtype=np.uint8).reshape(1, KEY_SIZE))[0]

    def many(self, keys: np.ndarray) -> list[str | None]:
        """The URLs of ``keys`` (an (n, 16) uint8 array), in order: each distinct key
        looked up once, all of them in the rank store in one vectorized search, then
        the ones it lacks in MainDB's in-memory indexes at once, and only the ones
        recorded there read (export resolves a batch of pages' links this way)."""
        if not len(keys):
            return []
        uniq, inverse = np.unique(np.ascontiguousarray(keys).view(f"V{KEY_SIZE}").ravel(),
                                  return_inverse=True)
        ukeys = uniq.view(np.uint8).reshape(-1, KEY_SIZE)
        urls: list[str | None] = (self.ranks.urls(ukeys) if self.ranks is not None
                                  else [None] * len(ukeys))
        missing = np.array([u is None for u in urls], dtype=bool)
        if missing.any():
            rest = np.flatnonzero(missing)
            for i in rest[self.reader.contains_many(ukeys[rest])].tolist():
                urls[i] = self._recorded(ukeys[i].tobytes())
        return [urls[i] for i in inverse.ravel().tolist()]

    def _recorded(self, key: bytes) -> str | None:
        """The URL of a key MainDB has a record of (None: it went, or is damaged)."""
        cache = self._cache
        try:
            url = cache[key]
            cache.move_to_end(key)
            return url
        except KeyError:
            pass
        rec = self.reader.get_key(key, with_body=False)
        url = rec.url if rec is not None else None
        cache[key] = url
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return url


__all__ = ["Link", "Resolver", "inlink_counts", "inlinks", "link_position", "outlinks",
           "page_targets"]
