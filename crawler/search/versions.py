"""What a shard's search index holds: for every MainDB key it has read, the record's
version then and the hash of the anchor text it indexed with (crawler.search.indexer).

Incremental indexing compares this with MainDB's own snapshot
(``kvstore.Store.versions()``: each key's record version, in memory, no disk read), so a
second ``index`` reads only the records written since. Keys whose page is not indexed
(an error, a binary body, ``noindex``) are remembered too, so they are not read again.

On disk, in the index directory: ``versions.npy``, the base (a structured array sorted
by key, memory-mapped when read: the page cache holds it, not the process), and
``journal.bin``, fixed 32-byte records (key, version, anchor hash; little-endian)
appended after each tantivy commit and fsynced. An open folds a journal a stopped run
left into a new base (``.tmp``, fsync, rename) and empties it; so does the end of a
run. A kill -9 between a commit and its journal entry loses the entry only: those
pages are indexed again next time, which replaces their documents (idempotent). A torn
last journal record (a kill mid-write) is ignored.

Thread safety: one writer (the index lock, crawler.search.indexer) and no readers
besides it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

BASE = "versions.npy"
JOURNAL = "journal.bin"
DTYPE = np.dtype([("key", "V16"), ("ver", "<i8"), ("ahash", "<i8")])
GONE = -1  # a version no record has: the key was in MainDB and is no longer


def _high(keys: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each key of a V16 array as native uint64s: they order as the
    bytes do, and numpy sorts and searches them ~10x faster than 16-byte voids (a second
    run's lookup of 21M keys took minutes as voids)."""
    return np.ascontiguousarray(keys).view(">u8")[::2].astype(np.uint64)


def key_order(keys: np.ndarray) -> np.ndarray:
    """The stable order that sorts a V16 array by key (as ``np.argsort(keys,
    kind="stable")`` would): by the high halves, and by whole keys only where two share
    one (md5 keys: a pair in ~10^12 at 21M)."""
    hi = _high(keys)
    order = np.argsort(hi, kind="stable")
    sorted_hi = hi[order]
    if len(hi) > 1 and (sorted_hi[1:] == sorted_hi[:-1]).any():
        low = np.ascontiguousarray(keys).view(">u8")[1::2].astype(np.uint64)
        order = np.lexsort((low, hi))
    return order


def _sorted(arr: np.ndarray) -> np.ndarray:
    """``arr`` sorted by key, the last entry of each key winning (a journal in order)."""
    if len(arr) == 0:
        return arr
    arr = arr[key_order(arr["key"])]
    last = np.ones(len(arr), dtype=bool)
    last[:-1] = arr["key"][1:] != arr["key"][:-1]
    return arr if last.all() else arr[last]


class SortedKeys:
    """Where keys are in a V16 array sorted by key: searched by their high halves (the
    queries in order, so the searches walk the table instead of jumping about it: 4x
    faster at 5M), then checked whole; keys that share a high half are looked for one
    by one."""

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys
        self.hi = _high(keys) if len(keys) else np.zeros(0, dtype=np.uint64)

    def find(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, found) of a V16 array of keys; a position is meaningful only
        where found."""
        n = len(self.keys)
        if n == 0:
            return np.zeros(len(queries), dtype=np.intp), np.zeros(len(queries), dtype=bool)
        hi = _high(queries)
        order = np.argsort(hi)
        pos = np.empty(len(hi), dtype=np.intp)
        pos[order] = np.searchsorted(self.hi, hi[order])
        np.minimum(pos, n - 1, out=pos)
        found = self.keys[pos] == queries
        for i in np.flatnonzero(~found & (self.hi[pos] == hi)).tolist():
            p = int(pos[i]) + 1  # a shared high half: the run of them, in key order
            while p < n and self.hi[p] == hi[i]:
                if self.keys[p] == queries[i]:
                    pos[i], found[i] = p, True
                    break
                p += 1
        return pos, found


class Versions:
    """The (key, version, anchor hash) of everything the index has read, sorted by key."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.table = self._load_base()
        self._where: SortedKeys | None = None  # made at the first lookup
        self._journal = open(os.path.join(directory, JOURNAL), "ab")  # noqa: SIM115
        # a journal left by a stopped run folded in at once: the table stays mapped
        # (page cache) instead of held (32 bytes a record: 0.7 GB at 21M)
        self.checkpoint()

    def _load_base(self) -> np.ndarray:
        path = os.path.join(self.dir, BASE)
        if not os.path.exists(path):
            return np.zeros(0, dtype=DTYPE)
        base: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
        if base.dtype != DTYPE:
            raise ValueError(f"{path}: not a versions file (dtype {base.dtype})")
        return base

    def _read_journal(self) -> np.ndarray:
        path = os.path.join(self.dir, JOURNAL)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return np.zeros(0, dtype=DTYPE)
        whole = size - size % DTYPE.itemsize
        if whole < size:  # a torn last record (a kill mid-write): cut, as if unwritten
            os.truncate(path, whole)
        # read straight into the array: a spill's journal is ~0.7 GB at 21M records
        return np.fromfile(path, dtype=DTYPE, count=whole // DTYPE.itemsize)

    def __len__(self) -> int:
        return len(self.table)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For a V16 array of keys: (their versions, their anchor hashes); -2 where the
        index has not read the key."""
        if len(self.table) == 0:
            missing = np.full(len(keys), -2, dtype=np.int64)
            return missing, missing.copy()
        if self._where is None:
            self._where = SortedKeys(self.table["key"])
        pos, found = self._where.find(keys)
        vers = np.where(found, self.table["ver"][pos], -2)
        hashes = np.where(found, self.table["ahash"][pos], -2)
        return vers, hashes

    def changed(self, keys: np.ndarray, vers: np.ndarray) -> np.ndarray:
        """Which of a store snapshot's keys (V16) the index has not read at this version."""
        changed: np.ndarray = self.lookup(keys)[0] != vers
        return changed

    def gone(self, keys: np.ndarray) -> np.ndarray:
        """The keys the index has read (V16) that are not in a store snapshot's ``keys``."""
        if len(self.table) == 0:
            return np.zeros(0, dtype="V16")
        snapshot = SortedKeys(np.ascontiguousarray(keys)[key_order(keys)])
        present = snapshot.find(self.table["key"])[1]
        gone: np.ndarray = np.asarray(self.table["key"][~present])
        return gone

    def record(self, entries: Iterable[tuple[bytes, int, int]]) -> None:
        """Journal (key, version, anchor hash) entries, after the commit that holds them;
        durable when this returns."""
        arr = np.array(list(entries), dtype=DTYPE)
        if len(arr):
            self._journal.write(arr.tobytes())
            self._journal.flush()
            os.fsync(self._journal.fileno())

    def checkpoint(self) -> None:
        """Fold the journal into a new base and empty it (crash-safe at every step: a
        journal replayed again over the new base changes nothing)."""
        journal = self._read_journal()
        if len(journal) == 0:
            return
        merged = _sorted(np.concatenate([np.asarray(self.table), journal]) if len(self.table)
                         else journal)
        del journal
        gone = merged["ver"] == GONE
        if gone.any():
            merged = merged[~gone]
        del gone
        tmp = os.path.join(self.dir, BASE + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, merged, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.dir, BASE))
        del merged
        self.table, self._where = self._load_base(), None
        self._journal.truncate(0)
        os.fsync(self._journal.fileno())

    def close(self) -> None:
        self._journal.close()


__all__ = ["DTYPE", "GONE", "SortedKeys", "Versions", "key_order"]
