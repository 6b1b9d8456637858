"""PendSet: the URL digests of every pending URL, at 9 bytes a URL.

Theory of operation
-------------------
PendSet answers one question for admission, "is this URL already pending?",
for every pending URL of the shard: 14M a shard at the original's size. As a
``kvstore.KeySet`` (16-byte keys in a hash table up to 78% full) it cost ~29
bytes a URL, ~0.4 GB a shard; it is the largest thing a crawl keeps in memory
after MainDB's index.

Here a URL is its digest's first 8 bytes (a *fingerprint*; md5 spreads them
uniformly), kept in a sorted ``uint64`` array with a byte beside each that marks
it gone (claimed). Lookups are binary searches (vectorized for a batch). URLs
admitted since the last merge wait in a small ``kvstore.KeyIntMap`` (C lookups),
keyed by the fingerprint padded with zeros so that it too knows a URL by its
fingerprint alone; at ``MERGE_AT`` of them they are merged into the array (one
pass, which also drops the gone ones when they are a quarter of it). The open
builds the array in one sort. A fingerprint is in the array at most once, and
never both there and in the recent map: adding a gone one brings it back in
place.

Fingerprints collide: two URLs with the same first 8 digest bytes are one URL
here. A URL is then taken for pending while another is, and not admitted: with
n pending URLs a new URL is refused so with probability n / 2**64, 1.5e-12 at
27.6M, so about one URL lost in 10**11 URLs offered. The original's 16-byte md5
keys collide too, only more rarely.

Thread safety: one lock around every method (the committer adds and asks, the
workers' claims discard); a merge holds it for one pass over the array (0.13 s
at 13.5M URLs, one every 2^17 URLs admitted).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import kvstore

# Fingerprints admitted since the last merge that wait in the recent map (~30 bytes
# each) before one pass merges them into the sorted array.
MERGE_AT = 1 << 17


def fingerprints(keys: Any) -> np.ndarray:
    """The fingerprints (first 8 bytes, little-endian) of (n, 16) uint8 key rows."""
    arr = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, 16)
    return arr[:, :8].copy().view("<u8").reshape(-1)


def sorted_unique(fps: np.ndarray) -> np.ndarray:
    """``fps`` sorted in place, without repeats. Not np.unique: without a return_*
    argument numpy 2.4's hashes first, 12 s for 13.5M fingerprints against 0.3 s for a
    sort, and 6 us against 2 for a claim's 50 slots."""
    fps.sort()
    if len(fps) < 2:
        return fps
    keep = np.empty(len(fps), dtype=np.bool_)
    keep[0] = True
    np.not_equal(fps[1:], fps[:-1], out=keep[1:])
    return fps if keep.all() else fps[keep]


def _padded(rows: np.ndarray) -> np.ndarray:
    """Key rows with their last 8 bytes zeroed: the recent map's keys."""
    out = np.zeros((len(rows), 16), dtype=np.uint8)
    out[:, :8] = rows[:, :8]
    return out


class PendSet:
    """A set of 16-byte URL digests, held as 8-byte fingerprints (see the module)."""

    def __init__(self, keys: Any = None) -> None:
        self._lock = threading.Lock()
        self._recent = kvstore.KeyIntMap(width=1)
        self._sorted = np.zeros(0, dtype=np.uint64)
        self._gone = np.zeros(0, dtype=np.bool_)
        self._gone_count = 0
        if keys is not None and len(keys):
            self._sorted = sorted_unique(fingerprints(keys))
            self._gone = np.zeros(len(self._sorted), dtype=np.bool_)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sorted) - self._gone_count + len(self._recent)

    def nbytes(self) -> int:
        """Bytes of the sorted array and its gone bytes (not the recent map's)."""
        return int(self._sorted.nbytes + self._gone.nbytes)

    # -- one key ---------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or len(key) != 16:
            return False
        return bool(self.contains_many(np.frombuffer(key, dtype=np.uint8).reshape(1, 16))[0])

    def add(self, key: bytes) -> None:
        self.add_many(np.frombuffer(key, dtype=np.uint8).reshape(1, 16))

    def discard(self, key: bytes) -> None:
        self.discard_many(np.frombuffer(key, dtype=np.uint8).reshape(1, 16))

    # -- batches ---------------------------------------------------------------

    def _slots(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index, whether the array holds it, gone or not) for each of ``fps``.
        Caller holds the lock."""
        n = len(self._sorted)
        if not n:
            return np.zeros(len(fps), dtype=np.intp), np.zeros(len(fps), dtype=np.bool_)
        at = np.minimum(np.searchsorted(self._sorted, fps), n - 1)
        return at, self._sorted[at] == fps

    def contains_many(self, keys: Any) -> np.ndarray:
        """A bool for each of ``keys`` ((n, 16) uint8 rows): pending or not."""
        rows = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, 16)
        fps = fingerprints(rows)
        with self._lock:
            at, held = self._slots(fps)
            hit = held & ~self._gone[at] if len(self._sorted) else held
            if len(self._recent):
                hit |= self._recent.contains_many(_padded(rows))
            return hit

    def add_many(self, keys: Any) -> None:
        rows = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, 16)
        fps = fingerprints(rows)
        with self._lock:
            at, held = self._slots(fps)
            back = sorted_unique(at[held])
            back = back[self._gone[back]]  # gone ones added again: live in place
            self._gone[back] = False
            self._gone_count -= len(back)
            fresh = rows[~held]
            if len(fresh):
                self._recent.put_many(_padded(fresh), np.zeros(len(fresh), dtype=np.int64))
                if len(self._recent) >= MERGE_AT:
                    self._merge()

    def discard_many(self, keys: Any) -> None:
        """Discard each of ``keys`` ((n, 16) uint8 rows), held or not."""
        rows = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, 16)
        fps = fingerprints(rows)
        with self._lock:
            recent = np.zeros(len(rows), dtype=np.bool_)
            if len(self._recent):
                padded = _padded(rows)
                recent = self._recent.contains_many(padded)
                for key in {row.tobytes() for row in padded[recent]}:  # a key twice: once
                    del self._recent[key]  # held: the lock keeps it so
            at, held = self._slots(fps)
            live = held & ~recent
            gone = sorted_unique(at[live])
            gone = gone[~self._gone[gone]]
            self._gone[gone] = True
            self._gone_count += len(gone)

    def _merge(self) -> None:
        """The recent fingerprints into the sorted array, the gone ones out of it when
        they are a quarter of it. Caller holds the lock."""
        keys, _ = self._recent.items_arrays()
        recent = fingerprints(keys)
        recent.sort()
        keep = self._sorted
        if self._gone_count * 4 > len(keep):
            keep = keep[~self._gone]
            gone = np.zeros(len(keep), dtype=np.bool_)
        else:
            gone = self._gone
        at = np.searchsorted(keep, recent)
        self._sorted = np.insert(keep, at, recent)
        self._gone = np.insert(gone, at, False)
        self._gone_count = int(np.count_nonzero(self._gone))
        self._recent = kvstore.KeyIntMap(width=1)
