"""What ``status`` counts, shard by shard: the committer's counters when they describe
the stores as they are, else every record and bulk read (``status --recount``).

The counters (crawler.state.tally) cost a file read and a few stats whatever the
crawl's size; the scan reads every record's header, about a second per 100,000
pages. Beside a running crawl the committer rewrites the counters after every
commit, so a read can fall between a commit's flushes and the counters that
follow them: the counters are read again for up to ``LIVE_WAIT`` seconds before
the scan is the answer.

A scan of a shard no run holds rewrites its counters when the stores did not
change while it read them (same stamp before and after) and it skipped no
damaged record: one slow ``status`` after a kill -9 or a ``compact``, and the
next is fast again. Beside a running crawl it writes nothing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np

import kvstore

from ..outcomes import outcome_key
from ..state.pages import bulk_keys
from ..state.pendset import fingerprints, sorted_unique
from ..state.tally import Tally, shard_stamp, stale_reason, write_counts
from .listing import CrawlReader, absent_shards

log = logging.getLogger(__name__)

LIVE_WAIT = 0.5  # seconds a running shard's counters are read again while behind its stores
_LIVE_PAUSE = 0.002
_PENDING_BATCH = 1 << 16  # pending URLs looked up at once by a scan
RECOUNT = "--recount"


@dataclass
class ShardCount:
    tally: Tally
    stored: int  # records in MainDB, damaged ones included
    source: str  # "counters" or "scan"
    why: str = ""  # why a scan: RECOUNT, or what was wrong with the counters


def count_shards(data_dir: str, dirs: list[str], running: list[bool], *,
                 recount: bool = False) -> tuple[list[ShardCount], list[int]]:
    """Each shard's counts (an absent shard: zero), and the absent shards."""
    absent = absent_shards(data_dir, dirs)
    out = []
    for i, d in enumerate(dirs):
        if i in absent:
            out.append(ShardCount(Tally(), 0, "counters"))
            continue
        why = RECOUNT
        if not recount:
            tally, why = _counters(d, running[i])
            if tally is not None:
                out.append(ShardCount(tally, tally.recorded, "counters"))
                continue
        tally, stored = scan_shard(d, keep=not running[i])
        out.append(ShardCount(tally, stored, "scan", why))
    return out, absent


def _counters(d: str, running: bool) -> tuple[Tally | None, str]:
    """The counters of shard ``d`` if current (a running one: within LIVE_WAIT)."""
    deadline = time.monotonic() + LIVE_WAIT
    while True:
        tally, why = stale_reason(d)
        if tally is not None or not running or time.monotonic() > deadline:
            return tally, why
        time.sleep(_LIVE_PAUSE)


def scan_shard(d: str, *, keep: bool) -> tuple[Tally, int]:
    """Count shard ``d`` by reading every record and bulk; (counts, records stored).
    ``keep``: no run holds the shard, so the counters file may be rewritten."""
    before = _stamp(d)
    tally = Tally()
    stored = skipped = 0
    reader = CrawlReader(d) if os.path.isdir(os.path.join(d, "main")) else None
    try:
        main = reader.main if reader is not None else None
        if reader is not None and main is not None:
            stored = len(main)
            for key in main:
                page = reader.load(0, key, with_body=False)
                if page is not None:
                    tally.count(page.status, outcome_key(page.status, page.reason,
                                                         page.truncated))
            skipped = reader.skipped
        tally.pending_bulks, tally.pending = _pending(d, main)
    finally:
        if reader is not None:
            reader.close()
    if keep and not skipped and before is not None and _stamp(d) == before:
        try:
            write_counts(d, tally, before)
        except OSError as exc:  # a read-only copy of a crawl: the next status scans again
            log.info("%s: counters not rewritten (%s)", d, exc)
    return tally, stored


def _stamp(d: str) -> dict[str, list[int] | None] | None:
    try:
        return shard_stamp(d)
    except FileNotFoundError:  # a compaction renamed files while we looked: do not keep
        return None


def _pending(d: str, main: kvstore.Store | None) -> tuple[int, int]:
    """(live PendDB bulks, URLs in them without a record) of one shard. A URL in two
    bulks counts once, told by its 8-byte fingerprint as the frontier's PendSet tells
    it: 8 bytes a URL and a sort (a KeySet of the 16-byte keys held ~40 B a URL, 1.7 GB
    at 27.6M pending). PendDB is read unmapped: each bulk once, none left in the RSS."""
    path = os.path.join(d, "pend")
    if not os.path.isdir(path):
        return 0, 0
    fps = bytearray()
    batch = bytearray()  # url_keys, 16 bytes each

    def left(batch: bytearray) -> bytes:
        keys = np.frombuffer(batch, dtype=np.uint8).reshape(-1, 16)
        if main is not None:
            keys = keys[~main.contains_many(keys)]
        return fingerprints(keys).tobytes()

    with kvstore.open(path, readonly=True, map_values=False) as pend:
        bulks = len(pend)
        for bk in pend:
            batch += bulk_keys(pend[bk])
            if len(batch) >= _PENDING_BATCH * 16:
                fps += left(batch)
                batch = bytearray()
        fps += left(batch)
    return bulks, len(sorted_unique(np.frombuffer(fps, dtype="<u8")))
