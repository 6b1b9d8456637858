"""RobotsStore: each host's last robots.txt answer, on disk (``robots/``), so a restart
does not fetch every host's robots.txt again.

Kept: the answers that decide for a day (RFC 9309 §2.4 lets a crawler cache
robots.txt up to 24 hours): a 2xx with its body (cut at the parser's limit),
and a 3xx/4xx, which means "no rules". Not kept: 5xx, 429 and unreachable,
which say "not now" and are retried within minutes. What is kept is the
answer, not the parsed rules: a resume with another ``--user-agent`` parses
the same body for its own group.

On disk (kvstore): md5 of the robots key (``scheme://host:port``) -> ``<d``
fetched_at (``time.time()``), ``<H`` status, then the body. It is advisory
state, like BadHosts: a write that fails (a full disk) costs a robots.txt
fetch after the next restart, so it is logged, not raised; a kill -9 loses at
most the entries written since their last flush (each put is flushed).

Thread safety: ``load`` and ``save`` from any thread (kvstore is thread-safe);
``close`` once, at the end.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct

import kvstore

log = logging.getLogger(__name__)

ROBOTS_STORE_NAME = "robots"
_HEAD = struct.Struct("<dH")


def store_key(robots_key: str) -> bytes:
    """The store's key for a robots key (``scheme://host:port``)."""
    return hashlib.md5(robots_key.encode("utf-8")).digest()


_key = store_key


def keeps(status: int | None) -> bool:
    """Whether an answer with ``status`` is worth keeping for a day."""
    return status is not None and 200 <= status < 500 and status != 429


class RobotsStore:
    """The robots.txt answers of one crawl directory."""

    def __init__(self, data_dir: str, *, max_body: int) -> None:
        self._store = kvstore.open(os.path.join(data_dir, ROBOTS_STORE_NAME))
        self.max_body = max_body

    def load(self, robots_key: str, now: float, ttl: float) -> tuple[int, bytes, float] | None:
        """(status, body, fetched_at) of the host's kept answer if it is younger than
        ``ttl`` at ``now``; None otherwise (never kept, expired, or damaged)."""
        try:
            data = self._store.get(_key(robots_key))
        except kvstore.exceptions.KVStoreError as exc:
            log.warning("robots store: %s (the host's robots.txt is fetched again)", exc)
            return None
        if data is None or len(data) < _HEAD.size:
            return None
        fetched_at, status = _HEAD.unpack_from(data)
        if not fetched_at <= now < fetched_at + ttl:  # a clock set back counts as expired
            return None
        return status, data[_HEAD.size :], fetched_at

    def save(self, robots_key: str, status: int, body: bytes, fetched_at: float) -> None:
        """Keep the answer (only what ``keeps`` accepts; others are ignored)."""
        if not keeps(status):
            return
        value = _HEAD.pack(fetched_at, status) + (body[: self.max_body] if status < 300 else b"")
        try:
            self._store[_key(robots_key)] = value
            self._store.flush()
        except (OSError, kvstore.exceptions.KVStoreError) as exc:
            log.warning("robots store: %s not kept: %s", robots_key, exc)

    def __len__(self) -> int:
        return len(self._store)

    def close(self) -> None:
        try:
            self._store.close()
        except OSError as exc:  # the buffered tail, on a full disk: a refetch later, no more
            log.warning("robots store: %s", exc)
            self._store.abandon()
