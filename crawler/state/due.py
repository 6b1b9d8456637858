"""When each fetched page is due again: ``start --revisit-after D`` keeps a crawl going.

Theory of operation
-------------------
The rule (``next_interval``). Every page record with an HTTP answer gets a
``revisit_interval``: D at its first fetch; at each revisit, half the last
interval if the page changed (another status, or another body) and twice it
if it did not (a 304 to the conditional GET, or the same body), never less
than D / 4 nor more than 8 D. A page is due at its fetch time plus that
interval. So a page that changes at every visit settles at D / 4, one that
never changes at 8 D, and one change brings a quiet page back twice as often.

The clock (``DueTimes``). The frontier keeps, for every done page that has an
interval, the millisecond it is due: an in-memory ``kvstore.KeyIntMap`` of width
6 (22 bytes a slot) rebuilt on open from ``due.bin``, an append-only log of
(url_key, due) records written with each commit's page records (a record
later in the file replaces an earlier one; crawler.state.recordlog). Every
``scan_interval`` (D / 8, at most a minute) the committer takes the keys due
now (one numpy pass over the map) and re-queues them: the URL into a new
PendDB bulk first, then a copy of the record into ``prior/`` (for the
conditional GET, crawler.run.revisit). The record stays in MainDB, so that
``pages``, ``show`` and ``export`` see the page while it waits for its fetch;
a claim takes a URL that is done in MainDB only when ``prior/`` marks it
re-queued, and the worker forgets the mark when an answer comes. A taken key
is not logged as taken: after a kill it is due again, and re-queued again
(the copy in a second bulk is skipped when claimed: by then MainDB has the new
answer and prior/ no mark).
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np

import kvstore

from ..exceptions import CrawlerError
from .admission import keys_array
from .pages import Pending, decode_page
from .recordlog import RecordLog, keys_of

__all__ = ["DUE_NAME", "MAX_FACTOR", "MIN_FACTOR", "DueTimes", "next_interval", "scan_interval"]

DUE_NAME = "due.bin"
MIN_FACTOR = 0.25  # the shortest interval: D / 4 (a page that changes at every visit)
MAX_FACTOR = 8.0  # the longest: 8 D (a page that never changes)
MAX_SCAN_INTERVAL = 60.0
MAX_REVISITS_PER_SCAN = 10_000  # re-queued by one commit at most; the rest at the next

log = logging.getLogger(__name__)


def next_interval(base: float, last: float, changed: bool | None) -> float:
    """The seconds until a page is due again. ``base``: D; ``last``: the interval of
    the previous fetch (0: none, a first fetch); ``changed``: whether this fetch found
    the page changed (None: a first fetch)."""
    if changed is None or last <= 0:
        return base
    step = last / 2 if changed else last * 2
    return min(max(step, base * MIN_FACTOR), base * MAX_FACTOR)


def scan_interval(base: float) -> float:
    """Seconds between two looks for due pages: D / 8, at most a minute."""
    return min(base / 8, MAX_SCAN_INTERVAL)


class DueTimes:
    """The due time (ms) of every revisitable done page of one frontier. The committer's
    alone (not thread-safe)."""

    def __init__(self, data_dir: str) -> None:
        self.map = kvstore.KeyIntMap(width=6)  # ms since the epoch (2**47 ms: 4,000 years)
        self.log = RecordLog(os.path.join(data_dir, DUE_NAME), "due", "<i8")
        for rec in self.log.chunks():  # later records win; 0: not due (re-queued)
            self.map.put_many(keys_of(rec), rec["due"])
        self.waiting = len(self.map.items_arrays(1)[1])  # pages waiting for their time

    def set(self, key: bytes, due: float) -> None:
        """``key`` is due at ``due`` (time.time()); ``write`` logs it."""
        ms = max(1, math.ceil(due * 1000))  # never early
        if self.map.get(key, 0) <= 0:
            self.waiting += 1
        self.map[key] = ms
        self.log.stage([(key, ms)])

    def take(self, now: float, limit: int) -> list[bytes]:
        """Up to ``limit`` keys due at ``now``, earliest first, due no more in memory.
        Nothing is logged: after a restart a taken key is due again until a new fetch
        logs a new time, and a scan only re-queues keys that are done in MainDB."""
        keys, due = self.map.items_arrays(1, int(now * 1000))  # memory: the due ones
        if not len(due):
            return []
        ready = np.argsort(due, kind="stable")[:limit]
        out = [keys[i].tobytes() for i in ready.tolist()]
        self.map.put_many(keys_array(out), np.zeros(len(out), dtype=np.int64))
        self.waiting -= len(out)
        return out

    def collect(
        self, now: float, limit: int, main: kvstore.Store
    ) -> tuple[list[bytes], list[bytes], list[Pending]]:
        """The pages due at ``now`` that are done in ``main``: (keys, their records,
        the entries that queue them again, at their recorded depth). A key no longer
        in ``main`` (a recrawl moved it) is skipped."""
        keys, records, entries = [], [], []
        for k in self.take(now, limit):
            record = main.get(k)
            if record is None:
                continue
            try:
                page = decode_page(record, with_body=False)
            except CrawlerError as exc:
                log.warning("record %s unreadable, not revisited: %s", k.hex(), exc)
                continue
            keys.append(k)
            records.append(record)
            entries.append(Pending(page.url, page.depth))
        return keys, records, entries

    def note(self, keys: list[bytes], records: list[bytes]) -> None:
        """Committed page records: each with an interval is due at its fetch time plus
        it (``write`` logs them, before the records reach MainDB)."""
        for k, record in zip(keys, records, strict=True):
            try:
                page = decode_page(record, with_body=False)
            except CrawlerError:
                continue  # the engine's own encoding: cannot happen, and costs a revisit
            if page.revisit_interval > 0:
                self.set(k, page.fetched_at + page.revisit_interval)

    def write(self) -> None:
        """Append this commit's records and flush them to the OS (raises OSError)."""
        self.log.write()
