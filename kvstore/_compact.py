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

Nothing damaged is copied and nothing live is left behind: each keyed record is
checked before it is copied (inside the file, a value, its key's own; its CRC
when the copy is read back), the new index must hold as many keys as the store
(a live key whose KEY record is damaged is never met by the chunks), and the new
files are read back in step after the fsync. Any failure raises before the
renames, with one line naming the record and the fix; the store discards the
tmp files and the old generation stays. Records are copied by pread, never
through a view of the map, so an error cannot leave the map pinned.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from typing import NoReturn

import numpy as np

from . import _datafiles, _indexfile, _mend
from . import _format as fmt
from ._backend import check_keyed_records, check_val_records
from ._index import HashIndex
from ._open import _Generation
from .exceptions import CorruptStoreError

log = logging.getLogger(__name__)

_CHUNK = 1 << 16  # KEY records per step
_COPY_PIECE = 8 << 20  # VAL bytes written (or values converted) per step
_GAP = 64 << 10  # dead bytes between live runs past which a read window ends


def _rows(keys: np.ndarray) -> list[bytes]:
    raw = np.ascontiguousarray(keys, dtype=np.uint8).tobytes()
    return [raw[i : i + fmt.KEY_SIZE] for i in range(0, len(raw), fmt.KEY_SIZE)]


def record_damage(mm: mmap.mmap, key: bytes, off: int, directory: str) -> str | None:
    """Why ``key``'s live record at ``off`` is not sound, with what mends it (``repair``
    when a sound record lies there: the KEY file names the wrong one; else the value
    itself is lost); None if it is sound."""
    problem, _ = fmt.check_keyed_record(mm, off, len(mm), key, off)
    if problem is None:
        return None
    if _mend.sound_record(mm, off, len(mm)) is not None:
        fix = f"The KEY file is damaged: python -m kvstore repair {directory} rebuilds it from VAL"
    else:
        fix = (f"python -m kvstore verify {directory} lists the damage and says whether "
               "repair mends it; a value that is itself damaged is lost (delete its key and "
               "compact again, or restore a backup)")
    return (f"the live record of key {key.hex()} at offset {off} is damaged ({problem}); "
            f"compaction stopped, nothing changed. {fix}")

class _Writer:
    """The new generation's two tmp files and index, filled in order."""

    def __init__(
        self, directory: str, gen: int, capacity: int, old_val_path: str, src_fd: int
    ) -> None:
        self.directory = directory
        self.old_val_path = old_val_path  # named in the errors about what it reads
        self.src_fd = src_fd  # the old VAL file, read by pread
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
        self.checked, self.checked_val = 0, fmt.HEADER_SIZE  # read back so far (check_written)

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
                self._write_val(b"".join(fmt.pack_deletion(k) for k in _rows(keys[a:b])))
            elif keyed:
                new_offs[a:b] = self._copy(mm, keys[a:b], offs[a:b])
            else:
                new_offs[a:b] = self._convert(mm, keys[a:b], offs[a:b])
        recs = fmt.key_records(keys, new_offs)
        _datafiles.write_all(self.key_fd, recs)
        self.key_size += len(recs)
        self.index.set_many(keys, new_offs)

    def _copy(self, mm: mmap.mmap, keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Keyed records copied byte for byte, once each is checked to be its key's own
        value (its CRC is checked when the copy is read back); returns their new offsets."""
        sizes = self._check_keyed(mm, keys, starts)
        ends = starts + sizes
        new_offs = self.val_end + np.concatenate(([0], np.cumsum(sizes)[:-1]))
        # Adjacent records make runs; runs close together make windows of about
        # _COPY_PIECE, each read with one pread and written with one write (pread, not a
        # view of the map: nothing pins the map if a write fails).
        first = np.concatenate(([True], starts[1:] != ends[:-1]))
        run_starts, run_ends = starts[first], ends[np.concatenate((first[1:], [True]))]
        new_window = np.concatenate(([True], run_starts[1:] - run_ends[:-1] > _GAP))
        group = np.cumsum(new_window)
        base = run_starts[new_window][group - 1]
        new_window |= np.concatenate(([True], np.diff((run_starts - base) // _COPY_PIECE) != 0))
        bounds = [*np.flatnonzero(new_window).tolist(), len(run_starts)]
        rs, re_ = run_starts.tolist(), run_ends.tolist()
        for w, w_end in zip(bounds, bounds[1:], strict=False):
            lo, hi = rs[w], re_[w_end - 1]
            if hi - lo > 2 * _COPY_PIECE:  # one long run: in pieces
                for pos in range(lo, hi, _COPY_PIECE):
                    self._write_val(self._read(pos, min(hi, pos + _COPY_PIECE)))
                continue
            window = memoryview(self._read(lo, hi))  # of bytes: nothing to pin
            self._write_val(b"".join([window[a - lo : b - lo]
                                      for a, b in zip(rs[w:w_end], re_[w:w_end], strict=True)]))
        return new_offs

    def _read(self, start: int, stop: int) -> bytes:
        data = os.pread(self.src_fd, stop - start, start)
        if len(data) != stop - start:  # the file shrank under us
            raise CorruptStoreError(self.old_val_path, start, "the VAL file is shorter than "
                                    "its records; compaction stopped, nothing changed")
        return data

    def _check_keyed(self, mm: mmap.mmap, keys: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Each keyed record at ``starts`` checked to lie inside the file, to be a value
        and ``keys``' own (vectorized); returns their sizes. Raises on the first that is
        not, naming it and the fix. Their CRCs are checked when the copies are read back
        (``check_written``: one pass over adjacent records, where a call a record here
        would cost more than the copy)."""
        size = len(mm)
        inside = (starts >= fmt.HEADER_SIZE) & (starts <= size - fmt.RECORD_HEADER_SIZE)
        if not inside.all():
            self._refuse(mm, keys, starts, int(np.argmin(inside)))
        data = np.frombuffer(mm, dtype=np.uint8)
        try:
            lengths = fmt.record_lengths(data, starts)
            owners = data[starts[:, None] + np.arange(8, fmt.RECORD_HEADER_SIZE)]
        finally:
            del data
        sizes = np.where(lengths == fmt.DELETED, 0, lengths) + fmt.RECORD_HEADER_SIZE
        bad = (lengths == fmt.DELETED) | (starts + sizes > size) | (owners != keys).any(axis=1)
        if bad.any():
            self._refuse(mm, keys, starts, int(np.argmax(bad)))
        return sizes

    def _refuse(self, mm: mmap.mmap, keys: np.ndarray, starts: np.ndarray, j: int) -> NoReturn:
        """Stop the compaction at live record ``j``, which is not sound."""
        key, off = bytes(keys[j]), int(starts[j])
        why = record_damage(mm, key, off, self.directory)
        raise CorruptStoreError(self.old_val_path, off, why or f"the live record of key "
                                f"{key.hex()} is not sound; compaction stopped, nothing changed")

    def _write_val(self, data: bytes) -> None:
        _datafiles.write_all(self.val_fd, data)
        self.val_end += len(data)

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
                self._write_val(data)
                batch, first, held = [], j + 1, 0
        return new_offs

    def check_written(self, explain: Callable[[bytes], str | None]) -> None:
        """Read the new files back from where the last check stopped and hold every KEY
        record against its VAL record in step, CRC and key (what ``verify`` does): the
        new generation must read back as written before it may replace the old one.
        A record that fails is first put to ``explain`` (its key): the old record it
        was copied from may be the damaged one, and that is what the error names."""
        stop = (self.key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
        if self.checked == stop:
            return
        step = _CHUNK * fmt.KEY_RECORD_SIZE
        fd = os.open(self.val_tmp, os.O_RDONLY)
        try:
            with mmap.mmap(fd, self.val_end, access=mmap.ACCESS_READ) as mm:
                begin = fmt.HEADER_SIZE + self.checked * fmt.KEY_RECORD_SIZE
                for start in range(begin, self.key_size, step):
                    recs = _read_keys(self.key_tmp, start, min(self.key_size, start + step))
                    raw = recs.view(np.uint8)
                    passed, self.checked_val = check_keyed_records(
                        mm, raw, self.val_end, self.checked_val
                    )
                    self.checked += passed
                    if passed < len(recs):
                        why = explain(recs["key"][passed].tobytes())
                        if why is not None:
                            raise CorruptStoreError(self.old_val_path, None, why)
                        break
        finally:
            os.close(fd)
        if self.checked != stop:
            raise CorruptStoreError(
                self.val_tmp, self.checked_val,
                f"the new generation does not read back as written (KEY record "
                f"{self.checked} of {stop}); compaction stopped, nothing changed",
            )

    def publish(self, explain: Callable[[bytes], str | None]) -> None:
        """fsync the new files, check that they hold exactly what was written, and
        rename them into place."""
        os.fsync(self.val_fd)
        os.fsync(self.key_fd)
        self.check_written(explain)
        sizes = (os.fstat(self.key_fd).st_size, os.fstat(self.val_fd).st_size)
        if sizes != (self.key_size, self.val_end) or self.checked_val != self.val_end:
            raise CorruptStoreError(
                self.val_tmp, None,
                f"the new generation's files are {sizes[0]:,} and {sizes[1]:,} bytes, "
                f"{self.key_size:,} and {self.val_end:,} were written ({self.checked_val:,} "
                "checked); compaction stopped, nothing changed",
            )
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
        self.src_fd = os.open(self.old.val_path, os.O_RDONLY)
        try:
            self.writer = _Writer(directory, self.old.gen + 1, capacity=len(g.index),
                                  old_val_path=self.old.val_path, src_fd=self.src_fd)
            try:
                self.mm = _map(self.old, g.wbuf[0])
            except BaseException:
                self.writer.discard()
                raise
        except BaseException:
            os.close(self.src_fd)
            raise

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

    def check_copied(self) -> None:
        """Read back what the chunks wrote (no lock needed: the new files are ours), so
        that the check under the lock at the end reads the tail alone."""
        self.writer.check_written(self._explain)

    def _explain(self, key: bytes) -> str | None:
        """Why ``key``'s live record in the old generation is not sound, with the fix;
        None if it is (then the copy, not the original, is at fault)."""
        found, _ = self.g.index.lookup_many(np.frombuffer(key, dtype=np.uint8).reshape(1, -1))
        off = int(found[0])
        if off < 0:
            return None
        with _map(self.old, self.g.wbuf[0]) as mm:
            return record_damage(mm, key, off, self.directory)

    def check_complete(self, index: HashIndex) -> None:
        """The new generation holds every key the store holds now (the store is flushed
        and locked): a live key whose KEY record is damaged was never seen by the chunks,
        and copying on without it would lose it."""
        new, old = len(self.writer.index), len(index)
        if new == old:
            return  # every copied key was live (the index pointed at its record): same set
        keys, _ = index.items_arrays()
        found, _ = self.writer.index.lookup_many(keys)
        lost = np.flatnonzero(found < 0)
        first = bytes(keys[lost[0]]).hex() if len(lost) else "?"
        raise CorruptStoreError(
            self.old.key_path, None,
            f"{old - new:,} live key(s) have no sound record in the KEY file (first: {first}); "
            "compaction stopped, nothing changed. The KEY file is damaged: python -m kvstore "
            f"repair {self.directory} rebuilds it from the VAL file",
        )

    def publish(self) -> None:
        """fsync the new files, check them, and rename them into place: from here on
        they are the store."""
        self.writer.publish(self._explain)
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
        os.close(self.src_fd)
