"""RobotsCache: the parsed robots.txt of each host, with expiry, bounded, one fetcher per host.

The rules themselves (RFC 9309 parsing and matching, the decision table for
each answer to a robots.txt fetch) are pure and live in
:mod:`crawler.web.robots`; this module holds them for a running crawl, shared
by its worker threads, and makes sure one thread at a time fetches a host's
robots.txt.

Thread-safety: every method is thread-safe (one internal lock, never held
while waiting).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ..exceptions import ConfigError
from ..web.robots import RobotsRules

__all__ = [
    "DEFAULT_FETCH_LEASE",
    "DEFAULT_MAX_CACHE_BYTES",
    "DEFAULT_MAX_HOSTS",
    "RobotsCache",
]

logger = logging.getLogger(__name__)

#: Hosts kept in a RobotsCache (least recently used ones are dropped).
DEFAULT_MAX_HOSTS = 10_000
#: Parsed robots.txt bytes kept in a RobotsCache, a proxy for its memory.
DEFAULT_MAX_CACHE_BYTES = 64 * 1024 * 1024
#: A fetch claimed with begin_fetch and not finished in this time may be claimed again.
DEFAULT_FETCH_LEASE = 120.0

#: A fixed cost per cache entry, so max_bytes also bounds many tiny entries.
_ENTRY_OVERHEAD = 512


@dataclass(slots=True)
class _Fetch:
    started: float
    done: threading.Event = field(default_factory=threading.Event)


class RobotsCache:
    """Host key -> RobotsRules with expiry, LRU-bounded, with one fetcher per host.

    Keys are the caller's (``URL.robots_key`` gives ``scheme://host:port``).
    Bounded by ``max_hosts`` entries and ``max_bytes`` of parsed robots.txt
    (plus a fixed overhead per entry); the least recently used go first.
    Every method is thread-safe (one internal lock, never held while waiting).

    Contract for the engine, per URL (``now`` from one clock throughout)::

        rules = cache.get(key, now)
        if rules is None:
            if cache.begin_fetch(key, now):        # we are the one fetcher
                try:
                    status, body = fetch(url.robots_url)           # None, None if unreachable
                    rules = RobotsRules.from_response(status, body, user_agent=ua,
                                                      now=clock(), previous=cache.peek(key))
                finally:
                    if rules is None:
                        cache.abort_fetch(key)     # releases the waiters, stores nothing
                    else:
                        cache.finish_fetch(key, rules)
            else:                                  # another thread is fetching:
                ...requeue the URL, or cache.wait(key, timeout) then get() again

    ``begin_fetch`` returns True to exactly one caller per host until that
    caller calls ``finish_fetch`` or ``abort_fetch``, or ``fetch_lease``
    seconds pass (a fetcher that died); then the next caller gets True.
    """

    def __init__(
        self,
        *,
        max_hosts: int = DEFAULT_MAX_HOSTS,
        max_bytes: int = DEFAULT_MAX_CACHE_BYTES,
        fetch_lease: float = DEFAULT_FETCH_LEASE,
    ) -> None:
        if max_hosts < 1 or max_bytes < 1 or fetch_lease <= 0:
            raise ConfigError("RobotsCache: max_hosts, max_bytes and fetch_lease must be positive")
        self.max_hosts = max_hosts
        self.max_bytes = max_bytes
        self.fetch_lease = fetch_lease
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, RobotsRules] = OrderedDict()
        self._bytes = 0
        self._fetching: dict[str, _Fetch] = {}
        self.evictions = 0

    def get(self, key: str, now: float) -> RobotsRules | None:
        """The host's rules if present and not expired at ``now``, else None.
        A hit counts as a use for the LRU order."""
        with self._lock:
            rules = self._entries.get(key)
            if rules is None:
                return None
            self._entries.move_to_end(key)
        return None if rules.expired(now) else rules

    def peek(self, key: str) -> RobotsRules | None:
        """The stored entry, even expired (for ``previous=``); does not touch the LRU order."""
        with self._lock:
            return self._entries.get(key)

    def begin_fetch(self, key: str, now: float) -> bool:
        """Claim the fetch of ``key``'s robots.txt. True: the caller must fetch
        and then call finish_fetch or abort_fetch. False: someone else is on it."""
        with self._lock:
            current = self._fetching.get(key)
            if current is not None and now - current.started < self.fetch_lease:
                return False
            if current is not None:
                logger.warning(
                    "robots fetch of %s not finished in %.0f s; claimed again",
                    key,
                    self.fetch_lease,
                )
                current.done.set()  # its waiters re-check and find the new claim
            self._fetching[key] = _Fetch(now)
            return True

    def finish_fetch(self, key: str, rules: RobotsRules) -> None:
        """Store ``rules`` for ``key``, end the fetch claim and wake the waiters.
        May be called without a claim (then it just stores)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size + _ENTRY_OVERHEAD
            self._entries[key] = rules
            self._bytes += rules.size + _ENTRY_OVERHEAD
            while len(self._entries) > 1 and (
                len(self._entries) > self.max_hosts or self._bytes > self.max_bytes
            ):
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size + _ENTRY_OVERHEAD
                self.evictions += 1
            fetch = self._fetching.pop(key, None)
        if fetch is not None:
            fetch.done.set()

    def abort_fetch(self, key: str) -> None:
        """End the fetch claim without storing anything; waiters wake and find no entry."""
        with self._lock:
            fetch = self._fetching.pop(key, None)
        if fetch is not None:
            fetch.done.set()

    def fetching(self, key: str) -> bool:
        """Whether a fetch of ``key`` is claimed and not finished."""
        with self._lock:
            return key in self._fetching

    def wait(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds while a fetch of ``key`` is in flight.
        True when no fetch was in flight or the one waited for ended (then call
        get; None again means it failed or was claimed anew), False on timeout."""
        with self._lock:
            fetch = self._fetching.get(key)
        if fetch is None:
            return True
        return fetch.done.wait(timeout)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def bytes(self) -> int:
        """The byte weight of the entries (parsed robots.txt bytes plus overhead)."""
        with self._lock:
            return self._bytes
