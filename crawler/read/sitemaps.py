"""The sitemaps a crawl read, from every shard's sitemap store (read-only, beside a live
crawl too): each record (crawler.state.sitemapstore), and a summary for ``status``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import kvstore

from ..state.shards import shard_dirs
from ..state.sitemapstore import SitemapStore, has_sitemaps


def sitemap_records(data_dir: str) -> Iterator[dict[str, Any]]:
    """Every sitemap record of the crawl in ``data_dir`` (all shards on this machine)."""
    for d in shard_dirs(data_dir):
        if not has_sitemaps(d):
            continue  # a shard of another machine, or a crawl made before sitemaps
        try:
            store = SitemapStore(d, readonly=True)
        except kvstore.exceptions.StoreNotFoundError:
            continue  # a crawl that is just creating it
        try:
            yield from store.records()
        finally:
            store.close()


def outcome(record: dict[str, Any]) -> str:
    """One word for how reading a sitemap ended: ok, the parser's error, or the answer."""
    if record["status"] == 200:
        return record["error"] or "ok"
    if record["status"] == 0:
        return record["reason"] or "failed"
    return f"http_{record['status']}"


def summary(data_dir: str) -> dict[str, Any]:
    """Counts over every sitemap record: read, URLs listed and handed to the frontier,
    and the outcomes (``ok``, ``http_404``, ``too_large``, ...)."""
    outcomes: Counter[str] = Counter()
    listed = admitted = 0
    for rec in sitemap_records(data_dir):
        outcomes[outcome(rec)] += 1
        listed += len(rec["urls"])
        admitted += rec["admitted"]
    return {
        "read": sum(outcomes.values()),
        "urls_listed": listed,
        "urls_admitted": admitted,
        "outcomes": dict(sorted(outcomes.items())),
    }
