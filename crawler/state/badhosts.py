"""BadHosts: hosts that cannot be reached, and when to try each again (``badhosts/``).

A host whose name did not resolve, whose address is off-limits, that refused
connections or showed a bad certificate is recorded with its reason and a
retry time; until then its other URLs are recorded at once, without touching
the network. On disk (kvstore): host key (:func:`crawler.web.urls.host_key`)
-> UTF-8 JSON ``{"host", "reason", "retry_at"}`` (``retry_at`` in
``time.time()`` seconds). Every entry is also held in a dict, read once at
open. It is advisory state: a write that fails (a full disk) loses only a
retry time, so it is logged, not raised.

Thread safety: ``reason`` and ``mark`` may be called from any thread (one
dict operation each; kvstore writes are thread-safe); ``close`` once, at the end.
"""

from __future__ import annotations

import json
import logging
import os

import kvstore

log = logging.getLogger(__name__)

BAD_HOSTS_NAME = "badhosts"


class BadHosts:
    """The bad hosts of one crawl, on kvstore and in memory."""

    def __init__(self, data_dir: str) -> None:
        self._store = kvstore.open(os.path.join(data_dir, BAD_HOSTS_NAME))
        self._entries: dict[bytes, dict[str, float | str]] = {
            k: json.loads(self._store[k]) for k in self._store
        }

    def reason(self, key: bytes, now: float) -> str | None:
        """Why the host of ``key`` is bad, if it still is at ``now``; else None."""
        bad = self._entries.get(key)
        if bad is not None and float(bad["retry_at"]) > now:
            return str(bad["reason"])
        return None

    def mark(self, key: bytes, host: str, reason: str, retry_at: float) -> None:
        """Record ``host`` (whose key is ``key``) as bad for ``reason`` until ``retry_at``."""
        entry: dict[str, float | str] = {"host": host, "reason": reason, "retry_at": retry_at}
        self._entries[key] = entry
        try:
            self._store[key] = json.dumps(entry).encode()
        except OSError as exc:  # advisory state: the host is still bad in memory
            log.warning("bad host %s not saved: %s", host, exc)

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        try:
            self._store.close()
        except OSError as exc:  # full disk: only retry times of bad hosts are lost
            log.warning("bad hosts not saved: %s", exc)
            self._store.abandon()
