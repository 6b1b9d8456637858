"""Bucketed spill files and sliced array files: the out-of-core pieces of rank and report.

A :class:`Spill` sorts a stream of fixed-size numpy records into ``buckets``
files by a bucket number the caller computes (a hash prefix, a block pair...),
buffering at most ``buffer`` records in memory in all: when the buffer is
full, every bucket's records are appended to its file (opened and closed per
flush, so a thousand buckets need no thousand descriptors). A bucket is read
back whole (its size is what the caller bounded) or in chunks.

The array helpers read and write slices of raw little-endian array files (the
layout ``np.memmap`` opens) through ordinary file I/O, so what a pass holds in
memory is the slice it works on, never the file: a memmap would leave every
page it touched resident in the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

DEFAULT_BUFFER = 1 << 20  # records buffered by a Spill across its buckets


class Spill:
    """Records of one dtype, appended by bucket. For one thread."""

    def __init__(self, directory: str, name: str, buckets: int, dtype: Any, *,
                 buffer: int = DEFAULT_BUFFER) -> None:
        self.dir, self.name, self.buckets = directory, name, buckets
        self.dtype = np.dtype(dtype)
        self.buffer = buffer
        self.counts = np.zeros(buckets, dtype=np.int64)  # records per bucket, written or not
        self._parts: dict[int, list[np.ndarray]] = {}  # bucket -> pieces not yet written
        self._held = 0
        os.makedirs(directory, exist_ok=True)

    def path(self, bucket: int) -> str:
        return os.path.join(self.dir, f"{self.name}-{bucket:05d}.bin")

    def add(self, bucket: np.ndarray, records: np.ndarray) -> None:
        """Append ``records`` (of this spill's dtype) to their ``bucket`` numbers."""
        if not len(records):
            return
        if self.buckets == 1:
            pieces = [(0, records.copy())]
        else:  # split now: what is held is ``buffer`` records, never a sorted copy of them
            order = np.argsort(bucket, kind="stable")
            bucket = bucket[order]
            cuts = np.flatnonzero(np.diff(bucket)) + 1
            starts = np.concatenate(([0], cuts)).tolist()
            ends = np.concatenate((cuts, [len(bucket)])).tolist()
            pieces = [(int(bucket[s]), records[order[s:e]]) for s, e in
                      zip(starts, ends, strict=True)]
        for b, piece in pieces:
            self._parts.setdefault(b, []).append(piece)
            self.counts[b] += len(piece)
        self._held += len(records)
        if self._held >= self.buffer:
            self.flush()

    def flush(self) -> None:
        for b, pieces in self._parts.items():
            with open(self.path(b), "ab") as f:
                for piece in pieces:
                    piece.tofile(f)
        self._parts, self._held = {}, 0

    def load(self, bucket: int) -> np.ndarray:
        """A whole bucket (empty if nothing went there). Flush first."""
        if not self.counts[bucket]:
            return np.empty(0, dtype=self.dtype)
        return np.fromfile(self.path(bucket), dtype=self.dtype)

    def chunks(self, bucket: int, size: int) -> Iterator[np.ndarray]:
        """A bucket in pieces of at most ``size`` records. Flush first."""
        if not self.counts[bucket]:
            return
        with open(self.path(bucket), "rb") as f:
            while True:
                part = np.fromfile(f, dtype=self.dtype, count=size)
                if not len(part):
                    return
                yield part

    def remove(self, bucket: int) -> None:
        try:
            os.unlink(self.path(bucket))
        except FileNotFoundError:
            pass

def read_slice(path: str, dtype: Any, start: int, count: int) -> np.ndarray:
    """``count`` items of an array file from item ``start`` (fewer at its end)."""
    dt = np.dtype(dtype)
    if count <= 0:
        return np.empty(0, dtype=dt)
    return np.fromfile(path, dtype=dt, count=count, offset=start * dt.itemsize)


def write_slice(path: str, start: int, values: np.ndarray) -> None:
    """Write ``values`` into an array file at item ``start`` (the file exists)."""
    with open(path, "r+b") as f:
        f.seek(start * values.dtype.itemsize)
        values.tofile(f)


def create(path: str, dtype: Any, count: int, fill: float = 0) -> None:
    """An array file of ``count`` items, all ``fill`` (zeros: a sparse file, nothing
    written), else written in slices of 64K items."""
    dt = np.dtype(dtype)
    with open(path, "wb") as f:
        if fill == 0:
            f.truncate(count * dt.itemsize)
            return
        step = 1 << 16
        for i in range(0, count, step):
            np.full(min(step, count - i), fill, dtype=dt).tofile(f)


def append(path: str, values: np.ndarray) -> None:
    with open(path, "ab") as f:
        values.tofile(f)


def memmap(path: str, dtype: Any, count: int) -> np.ndarray:
    """A read-only memmap of a whole array file (for lookups of a few items), or an empty
    array when ``count`` is 0 (a zero-length file cannot be mapped)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    # as a plain ndarray (the map lives on as its base): np.memmap's Python-level
    # __getitem__ made each item read ~3x slower, and lookups read items one by one
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=(count,)))
