"""A shard's outcome counters, kept by the committer: what ``status`` shows without
reading MainDB.

Theory of operation
-------------------
``counts.json`` (beside ``main/`` and ``pend/``) holds, for one shard, what
``status --recount`` counts by reading every record and every bulk: records by
outcome key (crawler.outcomes.outcome_key), records, records with an HTTP
answer, live PendDB bulks, and the URLs in them not recorded yet. It also holds
a *stamp*: the generation and the KEY and VAL file sizes of MainDB and PendDB
at the moment the counts were exact. kvstore only appends (a put, a delete) and
a compaction starts a new generation, so while the files still have the sizes
the stamp names, the stores hold exactly what was counted; any other writer
(a kill -9 between a commit's writes and the counters', ``retry``,
``python -m kvstore compact``, a tool) changes a size or the generation, and the
counters are known stale at the cost of a directory listing and four stats.

The committer (crawler.state.frontier) keeps them exact per commit:

- a record whose key MainDB did not have (``exists``: in memory) is a new
  record: +1 to its outcome, +1 recorded, -1 pending (its URL was claimed from
  a live bulk, so it was pending);
- a record that replaces one (a revisit, a record rewritten at a smaller
  depth) moves one count from the old record's outcome to the new one's: the
  old record is read (one get; rewrites are rare next to new pages);
- every URL admission lets in (new to MainDB, PendSet and ProcessingSet) is +1
  pending; a requeued URL and a page re-queued as due change nothing (the
  first is pending still, the second is recorded still);
- the live bulks are ``len(PendDB)``, read after the commit.

It writes the file after the commit's last flush (write, rename; no fsync: the
stores are not fsynced per commit either, and after a power loss a stale file
is caught by its stamp like any other). On open the frontier keeps counting
only when the file's stamp is the stores' and its totals are theirs (records,
bulks, and pending against PendSet, which the open rebuilds anyway). Otherwise
(a kill -9 between a commit's writes and the counters', a retry...) it recounts
MainDB's part from the outcome log (``recount``: its standing rows, and the heads
of the few records it does not stand for) and pending from PendSet. Only when
the log stands for too few records (a crawl made before it) does it count
nothing this run: ``status`` then reads every record, and rewrites the file from
that scan when no run holds the shard (crawler.read.counting).

Not thread-safe: the committer's, one commit at a time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

import kvstore

from ..exceptions import CrawlerError, DataDirError
from ..outcomes import outcome_key
from .admission import keys_array
from .jsonfile import read_json
from .outcomelog import standing, uncovered, words
from .pages import PageRecord, decode_page, read_page_head

log = logging.getLogger(__name__)

COUNTS_NAME = "counts.json"
COUNTS_FORMAT = 1
STORES = ("main", "pend")

Stamp = dict[str, list[int] | None]  # store name -> [generation, KEY bytes, VAL bytes]


@dataclass
class Tally:
    """What ``status`` counts for one shard."""

    outcomes: dict[str, int] = field(default_factory=dict)
    recorded: int = 0
    fetched: int = 0  # records with an HTTP answer (status > 0)
    pending: int = 0  # URLs in live bulks without a record
    pending_bulks: int = 0

    def count(self, page_status: int, key: str, n: int = 1) -> None:
        """``n`` records (negative: removed) of outcome ``key`` and HTTP status."""
        left = self.outcomes.get(key, 0) + n
        if left:
            self.outcomes[key] = left
        else:
            del self.outcomes[key]
        self.recorded += n
        self.fetched += n if page_status > 0 else 0

    def to_json(self) -> dict[str, Any]:
        return {"outcomes": dict(sorted(self.outcomes.items())), "recorded": self.recorded,
                "fetched": self.fetched, "pending": self.pending,
                "pending_bulks": self.pending_bulks}


def store_stamp(path: str) -> list[int] | None:
    """[generation, KEY file bytes, VAL file bytes] of the store at ``path`` (None: no
    store there): kvstore.stamp. Raises FileNotFoundError if a compaction renamed them
    away meanwhile."""
    found = kvstore.stamp(path)
    return list(found) if found is not None else None


def shard_stamp(data_dir: str) -> Stamp:
    """The stamp of a shard's MainDB and PendDB as they are on disk now."""
    return {name: store_stamp(os.path.join(data_dir, name)) for name in STORES}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_counts(data_dir: str) -> tuple[Tally, Stamp]:
    """The counters file of a shard. FileNotFoundError if it has none; DataDirError
    naming the file if it is damaged (cut, not JSON, fields of the wrong type) or of
    a newer format."""
    path = os.path.join(data_dir, COUNTS_NAME)
    doc = read_json(path, "a counters file")
    bad = DataDirError(f"{path}: not a counters file")
    if not isinstance(doc, dict) or not _whole(doc.get("format")):
        raise bad
    if doc["format"] > COUNTS_FORMAT:
        raise DataDirError(f"{path}: format {doc['format']} is newer than this crawler reads")
    stamp, outcomes = doc.get("stamp"), doc.get("outcomes")
    numbers = [doc.get(k) for k in ("recorded", "fetched", "pending", "pending_bulks")]
    if not (isinstance(stamp, dict) and set(stamp) == set(STORES)
            and all(s is None or (isinstance(s, list) and len(s) == 3 and all(map(_whole, s)))
                    for s in stamp.values())
            and isinstance(outcomes, dict) and all(map(_whole, outcomes.values()))
            and all(map(_whole, numbers))):
        raise bad
    recorded, fetched, pending, bulks = numbers
    return Tally(dict(outcomes), recorded, fetched, pending, bulks), stamp  # type: ignore[arg-type]


def write_counts(data_dir: str, tally: Tally, stamp: Stamp) -> None:
    """Replace the counters file (a reader sees the old file or the new one; another
    writer's temporary file is never this one's)."""
    path = os.path.join(data_dir, COUNTS_NAME)
    tmp = f"{path}.{os.getpid()}.tmp"
    doc = {"format": COUNTS_FORMAT, "stamp": stamp, **tally.to_json()}
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


def load_counts(data_dir: str) -> tuple[Tally | None, Stamp | None, Stamp | None, str]:
    """(counters, their stamp, the stores' stamp now, why they are not current: "" when
    they are). The counters are None when the file is absent or damaged."""
    try:
        tally, stamp = read_counts(data_dir)
    except FileNotFoundError:
        return None, None, None, "no counters (a crawl written before they were kept)"
    except DataDirError as exc:
        log.info("%s", exc)
        return None, None, None, "the counters file is damaged"
    try:
        now = shard_stamp(data_dir)
    except FileNotFoundError:  # a compaction renamed a store's files while we looked
        return tally, stamp, None, "the stores changed while they were read"
    if now != stamp:
        return tally, stamp, now, ("the counters are behind the stores (a kill -9, or "
                                   "retry, compact...)")
    return tally, stamp, now, ""


def stale_reason(data_dir: str) -> tuple[Tally | None, str]:
    """The shard's counters if they describe its stores as they are now, else None and
    why not (for a line of ``status``)."""
    tally, _, _, why = load_counts(data_dir)
    return (None, why) if why else (tally, "")


def _cut_back_to_counted(main: kvstore.Store, counted: list[int] | None,
                         now: list[int] | None) -> bool:
    """Whether this open of MainDB cut a torn tail (a kill -9 in an append) that the
    scan which wrote the counters had left out: they were stamped with the files before
    the cut, and the files now end where that read-only view ended."""
    found = main.recovery
    if found is None or not found.truncated or counted is None or now is None:
        return False
    tail = found.tail
    if tail is None:  # the open only mended KEY records from VAL: nothing was cut
        return False
    return (now[1:] == [tail.key_offset, tail.val_offset]
            and counted == [now[0], tail.key_offset + tail.key_bytes,
                            tail.val_offset + tail.val_bytes])


# Heads a recount at open may read (records the outcome log does not stand for: a
# kill -9 between a commit's MainDB flush and its log leaves a few hundred): past it,
# (a crawl made before the log) the run keeps no counters, as before the log existed.
RECOUNT_HEADS = 100_000


def recount(data_dir: str, main: kvstore.Store, max_heads: int | None = None
            ) -> Tally | None:
    """MainDB's part of the counters (outcomes, recorded, fetched) from the shard's
    outcome log (crawler.state.outcomelog: its standing rows, no record read) and the
    heads of the records it does not stand for, in file order; None if those are more
    than ``max_heads`` or one does not decode. Pending numbers are left at zero."""
    max_heads = RECOUNT_HEADS if max_heads is None else max_heads
    tally = Tally()
    covered = kvstore.KeySet()
    for _, facts in standing(data_dir, main, covered):
        which, outs = words(facts)
        for (status, reason, cut), n in zip(outs, np.bincount(which).tolist(), strict=True):
            if n:
                tally.count(status, outcome_key(status, reason, cut), n)
    if len(main) - len(covered) > max_heads:
        return None
    if len(covered) < len(main):
        for key in uncovered(main, covered):
            try:
                page = read_page_head(partial(main.get_prefix, key.tobytes()))
            except (kvstore.exceptions.KVStoreError, CrawlerError, ValueError,
                    TypeError) as exc:
                log.info("%s: record %s unreadable, not recounted: %s", data_dir,
                         key.tobytes().hex(), exc)
                return None
            tally.count(page.status, outcome_key(page.status, page.reason, page.truncated))
    return tally


class Keeper:
    """The committer's counters of one shard (crawler.state.frontier)."""

    def __init__(self, data_dir: str, main: kvstore.Store, pend: kvstore.Store,
                 pending: int) -> None:
        """``pending``: the URLs of live bulks not in MainDB (len(PendSet) after the
        frontier's rebuild). An empty shard starts at zero. Otherwise the counters file
        must match MainDB exactly (its stamp, or its stamp before this open cut a torn
        tail the counting scan left out, and its record count), or MainDB's part is
        recounted (``recount``), or nothing is counted this run; PendDB's two numbers
        are taken from the open, so a kill -9 during a commit's bulks or tombstones
        costs nothing. Written at once: status is exact
        from the open on."""
        self.data_dir = data_dir
        self.tally: Tally | None = None
        if not len(main) and not len(pend):
            self.tally = Tally()
        else:
            tally, stamp, now, why = load_counts(data_dir)
            if (tally is not None and why and stamp and now
                    and (stamp["main"] == now["main"]
                         or _cut_back_to_counted(main, stamp["main"], now["main"]))):
                why = ""  # MainDB as counted: only PendDB's numbers moved, taken below
            if tally is not None and not why and tally.recorded != len(main):
                why = "the counters disagree with MainDB"
            if tally is None or why:
                started = time.monotonic()
                tally = recount(data_dir, main)
                if tally is None:
                    log.info("%s: not keeping outcome counters this run: %s; `status` "
                             "counts by reading every record until it can rewrite them",
                             data_dir, why or "none")
                    return
                log.info("%s: outcome counters recounted from the outcome log in %.1f s "
                         "(%s)", data_dir, time.monotonic() - started, why or "none")
            tally.pending = pending
            self.tally = tally
        self.write(pend)

    def admitted(self, n: int) -> None:
        """``n`` URLs new to the crawl went to PendDB."""
        if self.tally is not None:
            self.tally.pending += n

    def records(self, main: kvstore.Store, keys: list[bytes],
                pages: list[PageRecord | None]) -> None:
        """Count the records about to be put (before the put: an old one is read);
        ``pages``: their heads (None: one that would not decode)."""
        tally = self.tally
        if tally is None or not keys:
            return
        try:
            known = main.contains_many(keys_array(keys)).tolist()
            for key, page, old in zip(keys, pages, known, strict=True):
                if page is None:
                    raise CrawlerError("a new record does not decode")
                if old:
                    was = decode_page(main[key], with_body=False)
                    tally.count(was.status, outcome_key(was.status, was.reason, was.truncated),
                                -1)
                    tally.pending += 1  # undone below: a rewrite leaves pending as it was
                tally.count(page.status, outcome_key(page.status, page.reason, page.truncated))
                tally.pending -= 1
        except (kvstore.exceptions.KVStoreError, CrawlerError, ValueError, TypeError) as exc:
            log.warning("%s: an old record is unreadable (%s): outcome counters stop for this "
                        "run (status reads every record)", self.data_dir, exc)
            self.tally = None

    def write(self, pend: kvstore.Store) -> None:
        """After a commit's last flush: the counters, stamped with the stores' files."""
        if self.tally is None:
            return
        self.tally.pending_bulks = len(pend)
        try:
            stamp = shard_stamp(self.data_dir)
        except FileNotFoundError:  # PendDB's compaction renamed its files as we looked
            return  # the next commit (or the close) writes them
        try:
            write_counts(self.data_dir, self.tally, stamp)
        except OSError as exc:  # a full disk: the counters are advisory, the crawl goes on
            log.warning("%s: outcome counters not written (%s): status will read every "
                        "record", self.data_dir, exc)
            self.tally = None
