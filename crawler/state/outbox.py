"""The outbox: links a shard found for other shards' hosts, durable until their owner has them.

Theory of operation
-------------------
A kvstore, ``outbox/`` in the shard's directory. Key: the destination shard
(4 bytes, big-endian) then a counter (12 bytes); value: the links as a PendDB
bulk (:func:`crawler.state.pages.encode_bulk`, one ``depth hops attempts url``
line each). The frontier's committer hands every candidate link to
:meth:`Outbox.route`, which keeps this shard's own and *stages* the others,
then calls :meth:`Outbox.write` in its step 1, flushed beside the new local
bulks and before any claimed bulk is tombstoned: the crash-safety invariant
of DESIGN §4.3 across shards (a URL handed to another shard is durable in the
outbox before the bulk that found it goes).

The forwarder (crawler.run.exchange) :meth:`take` s the oldest records of one
destination, thousands of URLs at a time, sends them as one message and,
once the owner answered that they are durable there, :meth:`ack` s them: they
are deleted. A kill between the owner's write and the ack sends them again:
the owner's admission dedups, so a re-delivery costs lookups, never a
duplicate. On open the live records are simply pending again.

A link staged recently is not staged again (two generations of dicts, like the
frontier's recent keys): its owner would drop it anyway, and navigation links
repeat on every page. Unless it comes at a smaller depth than it was sent at:
then its owner learns the shorter path (crawler.state.depths).

Thread safety: ``route`` and ``write`` from the committer; ``take`` and
``ack`` from one forwarder; ``pending``, ``urls`` and ``empty`` from anyone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import kvstore

from .pages import Pending, encode_bulk
from .shards import Router

log = logging.getLogger(__name__)

OUTBOX_NAME = "outbox"
DEFAULT_RECENT_SENT = 1 << 16  # keys per generation of the "staged recently" sets
_KEY = 16


@dataclass(slots=True)
class _Record:
    key: bytes
    urls: int
    written: float  # time.monotonic() of the write (0 for records found at open)


@dataclass(frozen=True, slots=True)
class Taken:
    """Records of one destination handed to the forwarder, to ack once delivered."""

    dest: int
    keys: tuple[bytes, ...]
    payload: bytes  # the records' bulks joined: one PendDB bulk
    urls: int


class Outbox:
    """The outbox of one shard (``place.index`` of ``place.count``)."""

    def __init__(self, data_dir: str, router: Router, *, recent: int = DEFAULT_RECENT_SENT) -> None:
        self.router = router
        self.index = router.place.index
        self._store = kvstore.open(os.path.join(data_dir, OUTBOX_NAME))
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)  # notified when records are written
        self._queues: dict[int, deque[_Record]] = {}
        self._staged: dict[int, list[Pending]] = {}
        # keys sent lately -> the depth sent at, in two generations
        self._recent: dict[bytes, int] = {}
        self._older: dict[bytes, int] = {}
        self._recent_cap = recent
        self._counter = 0
        self.staged_total = 0  # links staged since open (after the recent-keys filter)
        self.acked_urls = 0
        top = -1
        for key in sorted(self._store):
            dest, n = int.from_bytes(key[:4], "big"), int.from_bytes(key[4:], "big")
            top = max(top, n)
            urls = self._store[key].count(b"\n") + 1
            self._queues.setdefault(dest, deque()).append(_Record(key, urls, 0.0))
        self._counter = top + 1
        if self._queues:
            log.info("%s: %d links still to hand to other shards", data_dir, self.urls())

    # -- the committer ----------------------------------------------------------------

    def route(self, candidates: list[tuple[bytes, Pending]]) -> list[tuple[bytes, Pending]]:
        """This shard's candidates; the others are staged for :meth:`write`."""
        mine = []
        me, owner_of = self.index, self.router.owner_of
        recent, older = self._recent, self._older
        for cand in candidates:
            dest = owner_of(cand[1].url)
            if dest == me:
                mine.append(cand)
                continue
            key, depth = cand[0], cand[1].depth
            sent = recent.get(key)
            if sent is None:
                sent = older.get(key)
            if sent is not None and sent <= depth:  # a smaller depth goes again (state.depths)
                continue
            if len(recent) >= self._recent_cap:
                self._older, self._recent = recent, {}
                recent, older = self._recent, self._older
            recent[key] = depth
            self._staged.setdefault(dest, []).append(cand[1])
        return mine

    def write(self) -> int:
        """Write the staged links (one record per destination) and flush; how many."""
        if not self._staged:
            return 0
        staged, self._staged = self._staged, {}
        keys, values, records = [], [], []
        now = time.monotonic()
        for dest, entries in staged.items():
            key = dest.to_bytes(4, "big") + self._counter.to_bytes(_KEY - 4, "big")
            self._counter += 1
            keys.append(key)
            values.append(encode_bulk(entries))
            records.append((dest, _Record(key, len(entries), now)))
        self._store.put_many(keys, values)
        self._store.flush()
        n = sum(r.urls for _, r in records)
        with self._lock:
            for dest, rec in records:
                self._queues.setdefault(dest, deque()).append(rec)
            self.changed.notify_all()
        self.staged_total += n
        return n

    # -- the forwarder ----------------------------------------------------------------

    def pending(self) -> dict[int, tuple[int, float]]:
        """Destination -> (URLs waiting, monotonic time of its oldest record's write)."""
        with self._lock:
            return {
                d: (sum(r.urls for r in q), q[0].written) for d, q in self._queues.items() if q
            }

    def take(self, dest: int, max_urls: int) -> Taken | None:
        """The oldest records for ``dest``, about ``max_urls`` URLs (at least one record)."""
        with self._lock:
            q = self._queues.get(dest)
            if not q:
                return None
            recs: list[_Record] = []
            urls = 0
            for rec in q:
                if recs and urls + rec.urls > max_urls:
                    break
                recs.append(rec)
                urls += rec.urls
        payload = b"\n".join(self._store[r.key] for r in recs)
        return Taken(dest, tuple(r.key for r in recs), payload, urls)

    def ack(self, taken: Taken) -> None:
        """``taken`` is durable at its owner: delete its records (flushed)."""
        for key in taken.keys:
            del self._store[key]
        self._store.flush()
        with self._lock:
            q = self._queues[taken.dest]
            for key in taken.keys:
                if q and q[0].key == key:
                    q.popleft()
            self.acked_urls += taken.urls

    # -- state --------------------------------------------------------------------------

    def urls(self) -> int:
        with self._lock:
            return sum(r.urls for q in self._queues.values() for r in q)

    def empty(self) -> bool:
        """Nothing staged or waiting for its owner."""
        with self._lock:
            return not self._staged and not any(self._queues.values())

    def sync(self) -> None:
        self._store.sync()

    def close(self) -> None:
        self._store.close()

    def abandon(self) -> None:
        """Close after a failed write: what was flushed stays, nothing more is written."""
        self._store.abandon()
