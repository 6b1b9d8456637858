"""SitemapStore: every sitemap a crawl read, on disk (``sitemaps/``), so none is read twice.

A sitemap is not a page (it is not in MainDB, its "links" are not a page's
links): its outcome is kept here, one record per sitemap URL, written only
after the URLs it gave are durable in PendDB (crawler.run.sitemaps waits for
Frontier.receive). So a kill -9 between the two costs one more fetch of that
sitemap after the restart, never a URL.

On disk (kvstore): url_key (md5 of the normalized sitemap URL) -> ``b"KVSM"``,
a u8 format version, then zlib-compressed JSON:

    url, status (0: no answer), reason ("" or the failure: read_timeout, ...),
    fetched_at, level (0: from robots.txt or /sitemap.xml; n: listed by a level
    n-1 index), kind (urlset, index, text, "" for none), error (the parser's:
    too_large, bad_xml, ...), redirect (a 3xx's Location), urls ([[url, lastmod],
    ...] as listed, same origin only), children (an index's sitemaps, same origin),
    admitted (URLs handed to the frontier: in scope and within --max-depth; the
    frontier's dedup then drops the known ones), off_origin, dropped.

Thread safety: any thread (kvstore is thread-safe). A write that fails (a full
disk) is logged, not raised: the sitemap is read again by the next run.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections.abc import Iterator
from typing import Any

import kvstore

from ..exceptions import DataDirError
from ..web.urls import url_key

log = logging.getLogger(__name__)

SITEMAP_STORE_NAME = "sitemaps"
_MAGIC = b"KVSM"
_VERSION = 1


def encode_sitemap(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    return _MAGIC + bytes([_VERSION]) + zlib.compress(text.encode("utf-8"), 1)


def decode_sitemap(data: bytes) -> dict[str, Any]:
    """A record's fields; DataDirError if the bytes are not a record this version reads."""
    if data[:4] != _MAGIC or len(data) < 5:
        raise DataDirError("not a sitemap record")
    if data[4] > _VERSION:
        raise DataDirError(f"sitemap record version {data[4]} is newer than this crawler reads")
    try:
        record = json.loads(zlib.decompress(data[5:]).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, ValueError) as exc:
        raise DataDirError(f"damaged sitemap record: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("url"), str):
        raise DataDirError("damaged sitemap record: no url")
    return record


class SitemapStore:
    """The sitemaps of one crawl directory (one shard's)."""

    def __init__(self, data_dir: str, *, readonly: bool = False) -> None:
        path = os.path.join(data_dir, SITEMAP_STORE_NAME)
        self._store = kvstore.open(path, readonly=readonly)

    def get(self, url: str) -> dict[str, Any] | None:
        """The record of ``url`` (normalized), or None if it was never read (or is damaged)."""
        try:
            data = self._store.get(url_key(url))
            return None if data is None else decode_sitemap(data)
        except (kvstore.exceptions.KVStoreError, DataDirError) as exc:
            log.warning("sitemap store: %s: %s (it is read again)", url, exc)
            return None

    def put(self, record: dict[str, Any]) -> None:
        try:
            self._store[url_key(record["url"])] = encode_sitemap(record)
            self._store.flush()
        except (OSError, kvstore.exceptions.KVStoreError) as exc:
            log.warning("sitemap store: %s not kept: %s", record["url"], exc)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, in no particular order (damaged ones logged and left out)."""
        for key in self._store:
            try:
                yield decode_sitemap(self._store[key])
            except (kvstore.exceptions.KVStoreError, DataDirError) as exc:
                log.warning("sitemap store: record %s: %s", key.hex(), exc)

    def __len__(self) -> int:
        return len(self._store)

    def close(self) -> None:
        try:
            self._store.close()
        except OSError as exc:  # the buffered tail, on a full disk: read again later
            log.warning("sitemap store: %s", exc)
            self._store.abandon()


def has_sitemaps(data_dir: str) -> bool:
    """Whether a shard directory has a sitemap store (crawls before sitemaps have none)."""
    return os.path.isdir(os.path.join(data_dir, SITEMAP_STORE_NAME))
