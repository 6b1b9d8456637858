"""The frontier: MainDB, PendDB, PendSet and ProcessingSet behind one narrow interface.

Theory of operation
-------------------
State (DESIGN §4.1), all under the data directory:

* MainDB (``main/``, kvstore): url_key -> encoded PageRecord, every outcome.
* PendDB (``pend/``, kvstore): bulk key (a counter) -> ~25 pending URLs.
* PendSet (crawler.state.pendset, 8-byte fingerprints): url_keys of URLs in live,
  unclaimed-or-claimed bulks.
* ProcessingSet (KeySet): url_keys claimed and not yet committed.
* ``urls.log``: every admitted URL, one per line.

Workers *claim* a random unclaimed bulk; its URLs move from PendSet to
ProcessingSet. A worker never writes a store: it *submits* an Outcome (a page
record to store, or a URL to requeue, plus the links it found) to a queue.
One committer drains the queue in batches and writes, in this order:

1. new bulks (admitted links and requeued URLs) to PendDB, then flush;
2. page records to MainDB, then flush;
3. tombstones for claimed bulks whose every URL is now done or requeued, then flush.

So at every instant an admitted URL is in a live PendDB bulk or done in
MainDB, and a kill -9 loses only outcomes not yet written: URLs that were in
flight (claimed, not committed), which the next run fetches again. On open,
live bulks are simply live again; a URL already in MainDB is skipped when its
bulk is claimed. fsync runs every ``sync_interval`` seconds, on a thread of its
own so that the committer never waits for the disk.

The queue is bounded (``max_queued``, the engine's thread count): ``submit``
waits while that many outcomes are *uncommitted* (queued, or in the batch the
committer is writing) and resumes when a batch has reached the OS (before its
fsync). So a committer starved of the GIL by thousands of workers slows them
down instead of letting finished fetches pile up for a kill to lose: a kill
refetches at most the page in each worker's hands plus ``max_queued``. The
committer never waits on a worker (it only ever takes the queue and writes),
so the wait cannot deadlock; after a failed commit ``submit`` no longer waits
(nothing will be written again).

Admission dedup (MainDB, PendSet, ProcessingSet, this batch) happens only in
the committer, so two pages linking the same URL cannot both admit it; it is
crawler.state.admission, which also writes ``urls.log``. It asks PendSet and
ProcessingSet together under the claims' lock: a release moves a URL back from
one to the other, and asked apart it could be in neither.

One shard of several (a ``router`` given): step 1 also writes the links for
other shards' hosts to the outbox (crawler.state.outbox), flushed, so they
are durable before the bulk that found them is tombstoned. Links other shards
send here come in through ``receive`` and are admitted by the next commit
like any link; its event is set once they are written and fsynced, and only
then does the sender delete its copy (docs/SHARDS.md).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import kvstore

from ..config import DEFAULT_SYNC_INTERVAL
from ..exceptions import CrawlerError, DataDirError
from ..web.urls import url_key
from . import compaction
from .admission import DEFAULT_RECENT_KEYS, DEFAULT_VECTOR_BATCH, Admission, HeldTogether
from .admission import keys_array as _keys_array
from .bulkclaims import RELEASE_COOLDOWN, BulkClaims
from .depths import Depths, Expand
from .due import MAX_REVISITS_PER_SCAN, DueTimes, scan_interval
from .outbox import Outbox
from .outcomelog import OutcomeLog
from .pages import PageRecord, Pending, decode_bulk, decode_page, put_bulks
from .pendscan import read_pending
from .shards import Router
from .syncer import Syncer, compact_if_wasted
from .tally import Keeper

__all__ = [
    "DEFAULT_BULK_SIZE",
    "DEFAULT_RECENT_KEYS",
    "DEFAULT_SYNC_INTERVAL",
    "DEFAULT_VECTOR_BATCH",
    "DISK_FULL_ERRNOS",
    "RELEASE_COOLDOWN",
    "URL_LOG_NAME",
    "Claimed",
    "Frontier",
    "Outcome",
]

log = logging.getLogger(__name__)

DEFAULT_BULK_SIZE = 25
# PendDB is compacted (on the syncer's thread) once its dead bytes pass this and twice its
# live ones: claimed bulks leave tombstones and dead values behind, ~40 bytes a URL.
PEND_COMPACT_BYTES = 32 << 20
URL_LOG_NAME = "urls.log"
# errnos that mean "no space for this write" (EFBIG: a file size limit such as ulimit -f)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@dataclass(slots=True)
class Claimed:
    """One claimed URL: the bulk it came from and its key."""

    bulk: bytes
    key: bytes
    entry: Pending


@dataclass(slots=True)
class Outcome:
    """What a worker hands to the committer for one claimed URL."""

    claimed: Claimed
    record: bytes | None  # an encoded PageRecord, or None to requeue the URL
    requeue: Pending | None = None  # the entry to requeue (attempts updated)
    links: list[tuple[bytes, Pending]] = field(default_factory=list)  # (url_key, entry)


def _head(value: bytes) -> PageRecord | None:
    """A record's head, for the counters and the outcome log (None: it does not decode,
    which a record the engine just encoded always does)."""
    try:
        return decode_page(value, with_body=False)
    except (CrawlerError, ValueError, TypeError):
        return None


def _own(links: list[tuple[bytes, Pending]]) -> list[tuple[bytes, Pending]]:
    """The links of a one-shard crawl: all its own."""
    return links


class Frontier:
    """Thread-safe: ``claim`` and ``submit`` from any thread, ``commit`` from one."""

    def __init__(
        self,
        data_dir: str,
        *,
        bulk_size: int = DEFAULT_BULK_SIZE,
        sync_interval: float = DEFAULT_SYNC_INTERVAL,
        recent_keys: int = DEFAULT_RECENT_KEYS,
        max_queued: int | None = None,
        router: Router | None = None,
        track_depth: bool = False,
        expand: Expand | None = None,
        compact_bytes: int = PEND_COMPACT_BYTES,
        revisit_after: float | None = None,
        prior: kvstore.Store | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.bulk_size = bulk_size
        os.makedirs(data_dir, exist_ok=True)
        # Both stores read by pread, not through maps of their files (kvstore.open's
        # map_values): the open reads every PendDB bulk, and a crawl reads MainDB
        # records now and then (expand, revisits); mapped, each page read would stay in
        # the shard's RSS for good (~0.65 GB a shard of PendDB's alone at 20M pages).
        try:
            self.main = kvstore.open(
                os.path.join(data_dir, "main"), buffer_size=64 << 20, map_values=False
            )
        except kvstore.exceptions.StoreLockedError as exc:
            raise DataDirError(
                f"{data_dir}: another crawl is running on this data directory"
            ) from exc
        self.pend = kvstore.open(
            os.path.join(data_dir, "pend"), buffer_size=64 << 20, map_values=False
        )
        # One shard of several: links for other shards' hosts go to the outbox.
        self.outbox = Outbox(data_dir, router) if router and router.place.count > 1 else None
        self._received: list[tuple[list[tuple[bytes, Pending]], threading.Event]] = []
        self._closing = False  # receive() refuses from now on
        self.commits = 0  # commits that wrote something: the shard's activity counter
        self.processing = kvstore.KeySet()
        self._claims = BulkClaims(RELEASE_COOLDOWN)
        self._lock = threading.Lock()  # the claims, with PendSet and ProcessingSet
        self._qlock = threading.Lock()
        self._qroom = threading.Condition(self._qlock)  # submitters wait here for room
        self._queue: list[Outcome] = []
        self.max_queued = max_queued  # None: unbounded (single-threaded users, benchmarks)
        self._uncommitted = 0  # outcomes queued or in the batch being written
        self._seeds: list[tuple[bytes, Pending]] = []
        # A commit holds what it took from the queues (outcomes, seeds, links received)
        # until their bulks are claimable: idle() is false meanwhile (set and read under
        # _qlock). Without it, idle() saw empty queues and no claims in the window
        # between a commit's swap and its bulks becoming claimable, and a crawl ended
        # "complete" with its seed, or a page's links, never claimed.
        self._committing = False
        # Held by each commit: the syncer's compaction rewrites the outcome log under it
        # (crawler.state.compaction), when every record put has its log row.
        self._commit_lock = threading.Lock()
        self.syncer = Syncer(sync_interval, self._sync_stores, self._compact, data_dir)
        self.compact_bytes = compact_bytes
        self.compactions = 0
        # The smallest depth of each URL (crawler.state.depths); ``expand`` reads a
        # done page again when a shorter path to it turns up (the engine's).
        self.depths = Depths(data_dir, track=track_depth)
        # Each record's selection facts, apart from its body (crawler.state.outcomelog).
        self.outcomes = OutcomeLog(data_dir)
        self.outcomes.discard_leftovers()
        self.expand = expand
        # start --revisit-after: when each done page is due again (crawler.state.due);
        # a due page's record goes to ``prior`` (for the conditional GET) as it is re-queued.
        self.due = DueTimes(data_dir) if revisit_after else None
        if self.due is not None and prior is None:
            raise ValueError("Frontier: revisit_after needs the prior/ store")
        self.prior = prior
        self._scan_every = scan_interval(revisit_after) if revisit_after else 0.0
        self._next_scan = 0.0
        self.revisits = 0  # pages re-queued as due this run
        self.pend_set, self._counter = read_pending(self.pend, self.main, self.depths,
                                                    self._claims)
        if len(self._claims):
            log.info("%s: resuming with %d pending bulks", self.data_dir, len(self._claims))
        self._failed: BaseException | None = None  # a commit failed: write nothing more
        self._admission = Admission(
            os.path.join(data_dir, URL_LOG_NAME),
            (self.main, HeldTogether(self._lock, self.pend_set, self.processing)),
            recent_keys=recent_keys,
        )
        # status's numbers, kept per commit (crawler.state.tally)
        self.tally = Keeper(data_dir, self.main, self.pend, len(self.pend_set))

    # -- workers -------------------------------------------------------------

    def add_seeds(self, entries: list[Pending]) -> None:
        """Admit seed URLs (normalized) at the next commit, with the usual dedup."""
        with self._qlock:
            self._seeds.extend((url_key(e.url), e) for e in entries)

    def claim(self) -> list[Claimed] | None:
        """Claim a random unclaimed bulk; None when there is none right now."""
        with self._lock:
            bk = self._claims.take()
            if bk is None:
                return None
            out = []
            keys = []  # each leaves PendSet: MainDB or ProcessingSet knows it now
            for entry in decode_bulk(self.pend[bk]):
                k = url_key(entry.url)
                keys.append(k)
                if k in self.processing or (k in self.main and not self._revisiting(k)):
                    continue  # done before a restart, or in flight from another bulk
                self.processing.add(k)
                d = self.depths.get(k)
                if 0 <= d < entry.depth:  # a shorter path turned up since it was written
                    entry = entry._replace(depth=d)
                out.append(Claimed(bk, k, entry))
            if keys:
                self.pend_set.discard_many(_keys_array(keys))
            self._claims.hold(bk, len(out))
            return out

    def release(self, claimed: Claimed) -> None:
        """Hand back a claimed URL that was not worked on (its host's wait list was
        full). Nothing is written: the URL is still in its live bulk, which becomes
        claimable again RELEASE_COOLDOWN seconds after the last of its claimed URLs
        is committed or released. (Requeued instead, a busy host's URLs would be
        rewritten into new bulks again and again: PendDB growing with nothing done.)"""
        with self._lock:
            self.processing.discard(claimed.key)
            self.pend_set.add(claimed.key)
            self._claims.release(claimed.bulk)

    def receive(self, entries: list[Pending]) -> threading.Event:
        """Admit links another shard found for this one's hosts, at the next commit
        (deduplicated like any link). The event is set once they are durable here
        (written to PendDB and flushed, or known already). Thread-safe. Raises
        DataDirError once the frontier is closing or a commit failed: the sender
        keeps them and tries again later."""
        done = threading.Event()
        with self._qlock:
            if self._closing or self._failed is not None:
                raise DataDirError(f"{self.data_dir}: not receiving (stopping)")
            self._received.append(([(url_key(e.url), e) for e in entries], done))
        return done

    def submit(self, outcome: Outcome) -> None:
        """Queue an outcome for the committer. Thread-safe. Blocks while ``max_queued``
        outcomes are uncommitted, until the committer has written a batch (never after
        a failed commit: then nothing is written any more)."""
        with self._qroom:
            if self.max_queued is not None:
                while self._uncommitted >= self.max_queued and self._failed is None:
                    self._qroom.wait()
            self._queue.append(outcome)
            self._uncommitted += 1

    # -- the committer ----------------------------------------------------------

    def commit(self) -> int:
        """Write one batch of outcomes in the crash-safe order; return its size.

        If a write fails (a full disk), the error propagates and the frontier
        writes nothing more: the stores hold a consistent prefix (each flush is
        all-or-nothing, in the order above), and the lost batch's URLs are still
        in live bulks, so the next run fetches them again."""
        if self._failed is not None:
            raise DataDirError(f"{self.data_dir}: an earlier commit failed") from self._failed
        try:
            return self._commit()
        except BaseException as exc:
            self._failed = exc
            with self._qroom:
                self._qroom.notify_all()  # no submitter may wait for a failed committer
            raise

    def _commit(self) -> int:
        with self._qlock:
            batch, self._queue = self._queue, []
            seeds, self._seeds = self._seeds, []
            received, self._received = self._received, []
            self._committing = bool(batch or seeds or received)
        try:
            with self._commit_lock:
                return self._commit_taken(batch, seeds, received)
        finally:
            with self._qlock:
                self._committing = False

    def _commit_taken(self, batch: list[Outcome], seeds: list[tuple[bytes, Pending]],
                      received: list[tuple[list[tuple[bytes, Pending]], threading.Event]]
                      ) -> int:
        with self._lock:
            finished = self._claims.take_finished()
        due_keys, due_records, due_entries = self._due()
        if not batch and not seeds and not finished and not received and not due_keys:
            self._maybe_sync()
            return 0
        self.commits += 1
        candidates = seeds + [link for links, _ in received for link in links]
        candidates += [link for o in batch for link in o.links]
        route = self.outbox.route if self.outbox is not None else _own
        candidates = route(candidates)  # other shards' links are staged, written below
        rewrites: dict[bytes, bytes] = {}  # page records again at a smaller depth
        if self.depths.tracking:
            stored_at = {o.claimed.key: (o.record, o.claimed.entry) for o in batch if o.record}
            candidates, rewrites = self.depths.deepen(
                candidates, stored_at, self.main, route, self.expand
            )
        entries, new_keys = self._admission.dedup(candidates)
        self.tally.admitted(len(new_keys))
        self.depths.admit(new_keys, entries)
        requeued = [o for o in batch if o.record is None]
        entries += [o.requeue or o.claimed.entry for o in requeued] + due_entries
        new_keys += [o.claimed.key for o in requeued] + due_keys
        bulk_keys = self._write_bulks(entries)
        if self.outbox is not None:
            self.outbox.write()  # flushed, like the bulks: before any tombstone (step 3)
        self.depths.write()  # after the links that a smaller depth brought, before records
        if new_keys:
            self.pend_set.add_many(_keys_array(new_keys))
        if received:
            self.pend.sync()  # the sender deletes its copy on our word: make it power-safe
            for _, done in received:
                done.set()  # durable here: the sender may forget them
        if due_keys:  # in PendDB now; prior/ marks them re-queued (crawler.state.due)
            assert self.prior is not None
            kept = [(k, r) for k, r in zip(due_keys, due_records, strict=True)
                    if k not in self.prior]  # marked already (re-queued before a restart)
            if kept:
                self.prior.put_many([k for k, _ in kept], [r for _, r in kept])
                self.prior.flush()
            self.revisits += len(due_keys)
        stored = [o for o in batch if o.record is not None]
        if stored or rewrites:
            for o in stored:
                rewrites.setdefault(o.claimed.key, o.record)  # type: ignore[arg-type]
            keys, values = list(rewrites), list(rewrites.values())
            if self.due is not None:  # logged before the records are in MainDB
                self.due.note(keys, values)
                self.due.write()
            heads = [_head(v) for v in values]
            self.tally.records(self.main, keys, heads)
            self.main.put_many(keys, values)
            self.outcomes.note(self.main, keys, heads)
        if stored or rewrites:
            self.main.flush()
            self.outcomes.write()  # after MainDB's flush: it logs no record a kill lost
        if batch:
            self.processing.discard_many(_keys_array([o.claimed.key for o in batch]))
        with self._lock:
            finished += [o.claimed.bulk for o in batch if self._claims.commit(o.claimed.bulk)]
        for bk in finished:
            del self.pend[bk]
        if finished:
            self.pend.flush()
        self.tally.write(self.pend)  # after the last flush: stamped with the stores' files
        if bulk_keys:
            self._claims.add(_keys_array(bulk_keys))
        if batch:  # written to the OS: a kill no longer loses it, make room (before fsync)
            with self._qroom:
                self._uncommitted -= len(batch)
                self._qroom.notify(len(batch))
        self._maybe_sync()
        return len(batch) + len(seeds) + len(received)

    def _revisiting(self, key: bytes) -> bool:
        """Whether a done URL is re-queued for a revisit (its record stays in MainDB for
        readers until the new answer replaces it; prior/ holds the mark)."""
        return self.due is not None and key in self.prior  # type: ignore[operator]

    def _due(self) -> tuple[list[bytes], list[bytes], list[Pending]]:
        """The pages due again now (start --revisit-after), every scan interval."""
        if self.due is None:
            return [], [], []
        now = time.time()
        if now < self._next_scan:
            return [], [], []
        self._next_scan = now + self._scan_every
        return self.due.collect(now, MAX_REVISITS_PER_SCAN, self.main)

    def _write_bulks(self, entries: list[Pending]) -> list[bytes]:
        if not entries:
            return []
        keys, self._counter = put_bulks(self.pend, entries, self._counter, self.bulk_size)
        self.pend.flush()
        return keys

    def _maybe_sync(self, force: bool = False) -> None:
        self.syncer.maybe(force)

    def _stop_syncer(self) -> None:
        self.syncer.stop()

    def _compact(self) -> None:
        """The syncer's upkeep: both stores compacted when ``crawler compact`` asks
        (crawler.state.compaction), PendDB also once most of it is dead."""
        if compaction.asked(self.data_dir):
            result = compaction.compact_stores(self.data_dir, self.main, self.pend,
                                               self.outcomes, self._commit_lock)
            try:
                compaction.answer(self.data_dir, result)
            except OSError as exc:  # a full disk: logged; the request stays for a retry
                log.warning("%s: compaction result not written: %s", self.data_dir, exc)
        done = compact_if_wasted(self.pend, self.compact_bytes, f"{self.data_dir}: PendDB")
        if done:
            self.compactions += 1
        elif done is False:  # failed (a full disk): try again after twice the waste
            self.compact_bytes *= 2

    def _sync_stores(self) -> None:
        self.pend.sync()
        self.depths.log.sync()
        self.outcomes.sync()
        if self.due is not None:
            self.due.log.sync()
        if self.prior is not None:
            self.prior.sync()
        self.main.sync()
        if self.outbox is not None:
            self.outbox.sync()

    # -- state ------------------------------------------------------------------

    @property
    def sync_interval(self) -> float:
        """Seconds between fsyncs (settable)."""
        return self.syncer.interval

    @sync_interval.setter
    def sync_interval(self, value: float) -> None:
        self.syncer.interval = value

    @property
    def admitted(self) -> int:
        """URLs admitted since this frontier was opened. Thread-safe."""
        return self._admission.admitted

    def idle(self) -> bool:
        """Nothing pending, claimed, queued or unwritten: the crawl is complete."""
        with self._qlock:
            queued = bool(self._queue or self._seeds or self._received or self._committing)
        with self._lock:
            return not queued and self._claims.idle()

    def counts(self) -> dict[str, int]:
        return {
            "done": len(self.main),
            "pending": len(self.pend_set),
            "in_flight": len(self.processing),
            "bulks": len(self.pend),
            "admitted": self.admitted,
            "uncommitted": len(self._queue),  # outcomes waiting for the committer
        }

    def close(self) -> None:
        """Commit what is queued, fsync and close. Claimed, uncommitted URLs stay in
        their live bulks and are claimed again by the next run. After a failed
        commit nothing more is written: the stores are abandoned as they are."""
        with self._qlock:
            self._closing = True  # links arriving from now on stay with their sender
        if self._failed is None:
            try:
                self.commit()
                self._maybe_sync(force=True)
            except OSError as exc:  # a failed commit is in _failed already, an fsync not
                self._failed = self._failed or exc
        if self._failed is not None:
            try:
                self._stop_syncer()
            except BaseException:  # noqa: BLE001 - the first failure is the one reported
                pass
            closings = [self._admission.close, self.pend.abandon, self.depths.log.abandon,
                        self.outcomes.abandon, self.main.abandon]
            if self.due is not None:
                closings.append(self.due.log.abandon)
            if self.outbox is not None:
                closings.append(self.outbox.abandon)
            for closing in closings:
                try:
                    closing()
                except OSError as exc:  # the url log's buffered tail, on a full disk
                    log.warning("%s: %s", self.data_dir, exc)
            return
        self.tally.write(self.pend)  # stamped again: PendDB may have been compacted since
        self._admission.close()
        self.pend.close()
        self.depths.log.close()
        self.outcomes.close()
        if self.due is not None:
            self.due.log.close()
        self.main.close()
        if self.outbox is not None:
            self.outbox.close()
