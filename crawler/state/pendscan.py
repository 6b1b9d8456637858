"""The frontier's open: every live PendDB bulk read once, to make it claimable again and
to rebuild PendSet from its URLs that are not done yet.

After any stop (a clean close or a kill -9) the live bulks are the pending work: a URL
in one is pending unless MainDB holds its record (the bulk's tombstone was not written
yet when the run stopped). The URLs are handled ``REBUILD_BATCH`` at a time: at 14M
pending URLs a shard, a list of them all held ~1.5 GB while it lasted. PendSet is made of
the survivors' keys at once (one sort).
"""

from __future__ import annotations

import numpy as np

import kvstore

from .bulkclaims import BulkClaims
from .depths import Depths
from .pages import bulk_counter, bulk_depths, bulk_keys
from .pendset import PendSet

__all__ = ["REBUILD_BATCH", "read_pending"]

# Pending URLs handled at once while PendSet is rebuilt at open (~100 bytes each meanwhile).
REBUILD_BATCH = 1 << 18


def read_pending(pend: kvstore.Store, main: kvstore.Store, depths: Depths,
                 claims: BulkClaims) -> tuple[PendSet, int]:
    """(PendSet of the live bulks' URLs not in MainDB, the next bulk counter); every live
    bulk is claimable in ``claims``, and a tracked crawl's ``depths`` learn the depths
    the bulks hold (a crawl whose depths.bin lacks them)."""
    top = -1
    keys = bytearray()
    found: list[int] = []  # the depths, read only when tracked: the open's time is the keys'
    # One growing buffer, not a list of arrays: freed, it goes back to the OS whole
    # (batches of a few MB each would stay in the heap of the process for good).
    pending = bytearray()
    for bk in pend:  # in the file's order
        top = max(top, bulk_counter(bk))
        claims.unclaimed.add(bk)
        bulk = pend[bk]
        keys += bulk_keys(bulk)
        if depths.tracking:
            found += bulk_depths(bulk)
        if len(keys) >= REBUILD_BATCH * 16:
            pending += _not_done(keys, found, main, depths)
            keys, found = bytearray(), []
    pending += _not_done(keys, found, main, depths)
    pend_set = PendSet(np.frombuffer(pending, dtype=np.uint8).reshape(-1, 16)) if pending \
        else PendSet()
    del pending
    kvstore.release_freed_memory()  # the batches' and the sort's temporaries
    return pend_set, top + 1


def _not_done(keys: bytearray, found: list[int], main: kvstore.Store, depths: Depths) -> bytes:
    """Some pending URLs' keys joined, their depths folded in when tracked: the keys of
    those MainDB does not hold, joined."""
    arr = np.frombuffer(keys, dtype=np.uint8).reshape(-1, 16)
    depths.fold(arr, found)
    if not len(arr):
        return b""
    left: bytes = arr[~main.contains_many(arr)].tobytes()
    return left
