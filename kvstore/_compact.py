"""Compaction: copy the live records into a new generation while the store stays in use.

Theory of operation
-------------------
1. Under the lock: flush, and note where the KEY file ends (the *snapshot*).
2. Without the lock, chunk by chunk: a KEY record before the snapshot is
   copied when the index still points at it (it is live). A keyed value record
   (format 3) is copied verbatim, header and CRC included, into
   ``data-<gen+1>.val.tmp``, once its key is seen to be the KEY record's (a
   damaged KEY record stops the compaction: copying would bless another key's
   value); a plain one (formats 1 and 2) is CRC-checked and rewritten as a
   keyed record: a compaction is how a store moves to format 3. A KEY record
   with its new offset goes into ``data-<gen+1>.key.tmp``, and a new index is
   built alongside. Runs of adjacent live records are copied from the map in
   bounded pieces. The lock is taken only to look the chunk's keys up.
3. Under the lock: flush, then replay every KEY record written after the
   snapshot (puts and tombstones, in order, a tombstone with its deletion
   record) into the new files and index; fsync, rename VAL then KEY into
   place, fsync the directory, swap the generation in, delete the old files.

Until both renames are done the old generation is the store; after them the
new one holds everything the old one did. A crash in between leaves a
half-renamed generation that the next open ignores and deletes.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Iterator

import numpy as np

from . import _datafiles, _indexfile
from . import _format as fmt
from ._backend import check_val_records
from ._index import HashIndex
from ._open import _Generation
from .exceptions import CorruptStoreError

log = logging.getLogger(__name__)

_CHUNK = 1 << 16  # KEY records per step
_COPY_PIECE = 8 << 20  # VAL bytes written (or values converted) per step


def _rows(keys: np.ndarray) -> list[bytes]:
    raw = np.ascontiguousarray(keys, dtype=np.uint8).tobytes()
    return [raw[i : i + fmt.KEY_SIZE] for i in range(0, len(raw), fmt.KEY_SIZE)]


class _Writer:
    """The new generation's two tmp files and index, filled in order."""

    def __init__(self, directory: str, gen: int, capacity: int, old_val_path: str) -> None:
        self.old_val_path = old_val_path  # named in the errors about what it reads
        self.key_path, self.val_path = _datafiles.data_paths(directory, gen)
        self.key_tmp, self.val_tmp = self.key_path + ".tmp", self.val_path + ".tmp"
        self.key_fd = self.val_fd = -1
        self.key_fd = os.open(self.key_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.val_fd = os.open(self.val_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _datafiles.write_all(self.key_fd, fmt.pack_header(fmt.KEY_MAGIC, gen))
        _datafiles.write_all(self.val_fd, fmt.pack_header(fmt.VAL_MAGIC, gen))
        self.val_end = fmt.HEADER_SIZE
        self.key_size = fmt.HEADER_SIZE
        self.index = HashIndex(6, capacity=capacity)

    def append(self, mm: mmap.mmap, keys: np.ndarray, offs: np.ndarray, keyed: bool) -> None:
        """Copy the records at ``offs`` (-1 = tombstone) of the old VAL file (``keyed``:
        its layout) and their keys, in order, as keyed records (format 3)."""
        n = len(offs)
        new_offs = np.full(n, fmt.TOMBSTONE, dtype=np.int64)
        is_put = offs >= 0
        bounds = [0, *(np.flatnonzero(is_put[1:] != is_put[:-1]) + 1).tolist(), n]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if a == b:
                continue
            if not is_put[a]:  # a delete made while compaction ran leaves its record
                dels = b"".join(fmt.pack_deletion(k) for k in _rows(keys[a:b]))
                _datafiles.write_all(self.val_fd, dels)
                self.val_end += len(dels)
            elif keyed:
                new_offs[a:b] = self._copy(mm, keys[a:b], offs[a:b])
            else:
                new_offs[a:b] = self._convert(mm, keys[a:b], offs[a:b])
        recs = fmt.key_records(keys, new_offs)
        _datafiles.write_all(self.key_fd, recs)
        self.key_size += len(recs)
        self.index.set_many(keys, new_offs)

    def _copy(self, mm: mmap.mmap, keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Keyed records copied byte for byte, once each is seen to be its key's own;
        returns their new offsets."""
        data = np.frombuffer(mm, dtype=np.uint8)
        try:
            lengths = fmt.record_lengths(data, starts)
            owners = data[starts[:, None] + np.arange(8, fmt.RECORD_HEADER_SIZE)]
        finally:
            del data
        bad = np.flatnonzero((lengths == fmt.DELETED) | (owners != keys).any(axis=1))
        if len(bad):  # a damaged KEY record: copying would bless another key's value
            j = int(bad[0])
            raise CorruptStoreError(
                self.old_val_path, int(starts[j]),
                f"the record there is not key {bytes(keys[j]).hex()}'s own; compaction stopped, "
                "nothing changed (python -m kvstore verify lists the damage)",
            )
        sizes = lengths + fmt.RECORD_HEADER_SIZE
        ends = starts + sizes
        new_offs = self.val_end + np.concatenate(([0], np.cumsum(sizes)[:-1]))
        # Coalesce adjacent records into runs, written from the map in bounded pieces.
        breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1
        run_starts = starts[np.concatenate(([0], breaks))].tolist()
        run_ends = ends[np.concatenate((breaks, [len(starts)])) - 1].tolist()
        view = memoryview(mm)
        try:
            for a, b in zip(run_starts, run_ends, strict=True):
                for pos in range(a, b, _COPY_PIECE):
                    _datafiles.write_all(self.val_fd, view[pos : min(b, pos + _COPY_PIECE)])
        finally:
            view.release()
        self.val_end += int(sizes.sum())
        return new_offs

    def _convert(self, mm: mmap.mmap, keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Plain (format 1, 2) records rewritten as keyed ones, each value CRC-checked
        first (a damaged value must not get a new, valid CRC); returns their offsets."""
        size = len(mm)
        passed, _ = check_val_records(mm, np.ascontiguousarray(starts), size, fmt.HEADER_SIZE)
        if passed < len(starts):
            off = int(starts[passed])
            problem, _ = fmt.check_val_record(mm, off, size, fmt.HEADER_SIZE)
            raise CorruptStoreError(
                self.old_val_path, off, f"{problem}; compaction stopped, nothing changed "
                "(python -m kvstore verify lists the damage)",
            )
        new_offs = np.empty(len(starts), dtype=np.int64)
        batch: list[bytes] = []
        first = held = 0
        for j, off in enumerate(starts.tolist()):
            length, _ = fmt.unpack_val_header(mm, off)
            batch.append(mm[off + fmt.VAL_HEADER_SIZE : off + fmt.VAL_HEADER_SIZE + length])
            held += length
            if held >= _COPY_PIECE or j == len(starts) - 1:  # bounded: a piece at a time
                data, rel = fmt.keyed_records(keys[first : j + 1], batch)
                new_offs[first : j + 1] = self.val_end + rel
                _datafiles.write_all(self.val_fd, data)
                self.val_end += len(data)
                batch, first, held = [], j + 1, 0
        return new_offs

    def publish(self) -> None:
        os.fsync(self.val_fd)
        os.fsync(self.key_fd)
        os.rename(self.val_tmp, self.val_path)  # VAL first: a lone .val is an incomplete generation
        os.rename(self.key_tmp, self.key_path)
        _datafiles.fsync_dir(os.path.dirname(self.key_path))

    def close(self) -> None:
        for name in ("key_fd", "val_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def discard(self) -> None:
        self.close()
        for path in (self.key_tmp, self.val_tmp):
            if os.path.exists(path):
                os.remove(path)


def _read_keys(path: str, start: int, stop: int) -> np.ndarray:
    count = (stop - start) // fmt.KEY_RECORD_SIZE
    return np.fromfile(path, dtype=fmt.KEY_RECORD_DTYPE, count=count, offset=start)


def _map(files: _datafiles.DataFiles, length: int) -> mmap.mmap:
    fd = os.open(files.val_path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, length, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


class Compaction:
    """The file work of compacting generation ``g`` into ``g.gen + 1``. The store calls
    the steps in order: ``Compaction(path, g)``, ``replay_tail()``, ``publish()`` and
    ``open_new()`` under its lock after a flush; ``chunks()`` and ``copy()`` without
    it; ``discard()`` on any failure and ``close()`` at the end."""

    def __init__(self, directory: str, g: _Generation) -> None:
        self.directory, self.g, self.old = directory, g, g.files
        self.snapshot = g.key_size  # KEY records before it are copied while others write
        self.writer = _Writer(directory, self.old.gen + 1, capacity=len(g.index),
                              old_val_path=self.old.val_path)
        self.mm = _map(self.old, g.wbuf[0])

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(keys, offsets) of the KEY records before the snapshot, a chunk at a time."""
        step = _CHUNK * fmt.KEY_RECORD_SIZE
        for start in range(fmt.HEADER_SIZE, self.snapshot, step):
            recs = _read_keys(self.old.key_path, start, min(self.snapshot, start + step))
            yield fmt.record_keys(recs), recs["off"]

    def copy(self, keys: np.ndarray, offs: np.ndarray, *, live: np.ndarray) -> None:
        """Copy the records of a chunk whose ``live`` is set (the index still points there)."""
        self.writer.append(self.mm, keys[live], offs[live], self.old.keyed)

    def replay_tail(self) -> None:
        """Copy every record written since the snapshot, in order (the store is flushed)."""
        g, step = self.g, _CHUNK * fmt.KEY_RECORD_SIZE
        with _map(self.old, g.wbuf[0]) as tail_mm:
            for start in range(self.snapshot, g.key_size, step):
                recs = _read_keys(self.old.key_path, start, min(g.key_size, start + step))
                self.writer.append(tail_mm, fmt.record_keys(recs), recs["off"], self.old.keyed)

    def publish(self) -> None:
        """fsync the new files and rename them into place: from here on they are the store."""
        self.writer.publish()
        self.writer.close()

    def open_new(self) -> _Generation:
        w = self.writer
        files = _datafiles.DataFiles(
            self.directory, self.old.gen + 1, readonly=False, map_values=self.old.map_values
        )
        w.index.fit()
        files.remap(w.val_end)
        return _Generation(files, w.index, w.val_end, w.key_size)

    def remove_old(self) -> None:
        g, old, w = self.g, self.old, self.writer
        for path in (old.key_path, old.val_path):
            os.remove(path)  # readers holding the old files keep reading them
        with contextlib.suppress(FileNotFoundError):  # its saved index, if any
            os.remove(_indexfile.index_path(self.directory, old.gen))
        log.info(
            "%s: compacted generation %d (%d bytes) into %d (%d bytes)",
            self.directory, old.gen, g.key_size + g.wbuf[0], old.gen + 1,
            w.key_size + w.val_end,
        )

    def discard(self) -> None:
        self.writer.discard()

    def close(self) -> None:
        self.mm.close()
