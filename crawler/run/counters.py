"""A crawl's running counts: outcomes by key, fetches, bytes, browser subrequests.

Every worker adds to them; the status reporter reads them as a snapshot. They are
one object with one lock, handed to whoever counts (the engine, the page work,
sitemaps, subrequests, the robots.txt gate), so nobody needs the engine for it.

Thread-safe: every method takes the lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from .pagelimit import SharedPageLimit


@dataclass(frozen=True, slots=True)
class CountsSnapshot:
    fetched: int
    bytes: int
    subrequests: int
    outcomes: dict[str, int]  # by outcome key (crawler.outcomes), sorted


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.fetched = 0  # requests reserved against --max-pages
        self.bytes = 0  # bytes on the wire
        self.subrequests = 0  # requests made for pages rendering in the browser
        # the run's count of every shard on this machine (crawler.run.pagelimit)
        self.shared: SharedPageLimit | None = None

    def count(self, key: str, n: int = 1) -> None:
        """``n`` more outcomes of ``key`` (crawler.outcomes.outcome_key, or retry:...)."""
        with self._lock:
            self.outcomes[key] += n

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def subrequest(self, wire_bytes: int) -> None:
        with self._lock:
            self.subrequests += 1
            self.bytes += wire_bytes

    def reserve_fetch(self, limit: int | None) -> bool:
        """Count one fetch against ``limit`` (--max-pages), or against the count the
        shards of the run share when there is one (``shared``); False once it is
        reached."""
        with self._lock:
            if self.shared is not None:
                if not self.shared.reserve():
                    return False
            elif limit is not None and self.fetched >= limit:
                return False
            self.fetched += 1
            return True

    def snapshot(self) -> CountsSnapshot:
        with self._lock:
            outcomes = {k: v for k, v in sorted(self.outcomes.items()) if k}
            return CountsSnapshot(self.fetched, self.bytes, self.subrequests, outcomes)
