"""What a shard's search index holds: for every MainDB key it has read, the record's
version then and the hash of the anchor text it indexed with (crawler.search.indexer).

Incremental indexing compares this with MainDB's own snapshot
(``kvstore.Store.versions()``: each key's record version, in memory, no disk read), so a
second ``index`` reads only the records written since. Keys whose page is not indexed
(an error, a binary body, ``noindex``) are remembered too, so they are not read again.

On disk, in the index directory: ``versions.npy``, the base (a structured array sorted
by key, memory-mapped when read: the page cache holds it, not the process; one that
is not such a table, cut or empty is a DataDirError that says to rebuild), and
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

from ..exceptions import DataDirError
from ..read.graph import match
from .schema import REBUILD

BASE = "versions.npy"
JOURNAL = "journal.bin"
DTYPE = np.dtype([("key", "V16"), ("ver", "<i8"), ("ahash", "<i8")])
GONE = -1  # a version no record has: the key was in MainDB and is no longer
_NPY_MAGIC = b"\x93NUMPY"  # what every .npy file starts with


def _halves(table: np.ndarray, *, copy_high: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) 8-byte halves of the keys of a V16 array or of a table's ``key``
    column, big-endian, so they order as the key bytes do: numpy sorts and searches
    integers ~10x faster than 16-byte voids (a second run's lookup of 21M keys took
    minutes as voids). Views of ``table``'s memory (a mapped table stays mapped); the
    high halves are copied as native integers unless ``copy_high`` is false."""
    n, step = len(table), table.dtype.itemsize
    hi, lo = (np.ndarray(n, dtype=">u8", buffer=table, offset=off, strides=(step,))
              if n else np.zeros(0, dtype=">u8") for off in (0, 8))
    return (hi.astype(np.uint64) if copy_high else hi), lo


def key_order(keys: np.ndarray) -> np.ndarray:
    """The stable order that sorts a V16 array by key (as ``np.argsort(keys,
    kind="stable")`` would): by the high halves, and by whole keys only where two share
    one (md5 keys: a pair in ~10^12 at 21M). 3x faster than a lexsort of both."""
    keys = np.ascontiguousarray(keys)
    hi, lo = _halves(keys)
    order = np.argsort(hi, kind="stable")
    sorted_hi = hi[order]
    if len(hi) > 1 and (sorted_hi[1:] == sorted_hi[:-1]).any():
        order = np.lexsort((lo, hi))
    return order


def _sorted(arr: np.ndarray) -> np.ndarray:
    """``arr`` sorted by key, the last entry of each key winning (a journal in order)."""
    if len(arr) == 0:
        return arr
    arr = arr[key_order(arr["key"])]
    last = np.ones(len(arr), dtype=bool)
    last[:-1] = arr["key"][1:] != arr["key"][:-1]
    return arr if last.all() else arr[last]


def _find(hi: np.ndarray, lo: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, found) of a V16 array of keys among keys sorted by (hi, lo)
    (crawler.read.graph.match: the queries searched in order, equal high halves
    walked)."""
    qhi, qlo = _halves(np.ascontiguousarray(queries))
    pos, found = match(hi, lo, qhi, qlo.astype(np.uint64))
    return np.minimum(pos, max(len(hi) - 1, 0)), found


class Versions:
    """The (key, version, anchor hash) of everything the index has read, sorted by key."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.table = self._load_base()
        self._high: np.ndarray | None = None  # the table's high key halves, at a lookup
        self._journal = open(os.path.join(directory, JOURNAL), "ab")  # noqa: SIM115
        # a journal left by a stopped run folded in at once: the table stays mapped
        # (page cache) instead of held (32 bytes a record: 0.7 GB at 21M)
        self.checkpoint()

    def _load_base(self) -> np.ndarray:
        path = os.path.join(self.dir, BASE)
        if not os.path.exists(path):
            return np.zeros(0, dtype=DTYPE)
        with open(path, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
        if magic != _NPY_MAGIC:  # (np.load would say "pickled data... load it unsafely")
            raise DataDirError(f"{path}: not a versions table (not a .npy file: "
                               f"{'empty' if not magic else 'other bytes'}); {REBUILD}")
        try:  # never a pickle: allow_pickle=False refuses an object array
            base: np.ndarray = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:  # cut, a bad header, objects
            message = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise DataDirError(f"{path}: not a versions table ({message}); {REBUILD}"
                               ) from None
        if base.dtype != DTYPE or base.ndim != 1:
            raise DataDirError(f"{path}: not a versions table (dtype {base.dtype}, "
                               f"{base.ndim} dimension(s)); {REBUILD}")
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
        if self._high is None:
            self._high = _halves(self.table)[0]
        pos, found = _find(self._high, _halves(self.table, copy_high=False)[1], keys)
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
        ordered = np.ascontiguousarray(keys)[key_order(keys)]
        hi, lo = _halves(ordered)
        present = _find(hi, lo, self.table["key"])[1]
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
        self.table, self._high = self._load_base(), None
        self._journal.truncate(0)
        os.fsync(self._journal.fileno())

    def close(self) -> None:
        self._journal.close()


__all__ = ["DTYPE", "GONE", "Versions", "key_order"]
