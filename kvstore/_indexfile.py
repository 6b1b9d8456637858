"""The index written beside the KEY file at a clean close, so the next open reads it back
instead of rebuilding it from every KEY record.

Theory of operation
-------------------
``data-<gen>.idx`` is a snapshot of the in-memory table: every segment's key
and value slots exactly as they were, so the table read back is byte for byte
the one that was written (same capacities, same probe positions). It is only
a cache of what the KEY file says, and it is trusted only when its stamp
proves that it describes the files as they are now:

* the generation, the KEY file's length and the VAL file's length are those
  of the files on disk;
* the CRC-32 of the last few KiB of each file matches (a file replaced by
  another of the same length is caught). In a keyed store (format 3) a VAL tail
  that differs while everything else matches is rot in place: the index is used,
  with a warning, since every get checks its record's CRC and key, and a rebuild
  would cut the rotted record and all after it as if a write had been torn;
* the CRC-32 over the whole index file (header, segment table, slots) matches.

The KEY and VAL files only ever grow by appends, so equal lengths and equal
tails mean the index was written from exactly these records. Anything else (a
crash after more appends, a torn or rotted index file, a compaction, a file
from another store) fails the stamp, and the caller rebuilds the index from
the KEY file instead. A bad index is never used: the check costs one
sequential read at ~3 GB/s of CRC.

Layout (little-endian): a 56-byte header (magic ``KVSTIDX\\n``, u32 version,
u32 slot width W, u64 generation, u64 KEY length, u64 VAL length, u32 KEY
tail CRC, u32 VAL tail CRC, u32 segment count, u32 header CRC), then per
segment (u64 capacity, u64 live, u64 deleted), then per segment its key slots
(capacity x 16 bytes) and value slots (capacity x W bytes), then a u32 CRC of
everything before it.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ._index import NUM_SEGMENTS, HashIndex, _Segment

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAGIC = b"KVSTIDX\n"
VERSION = 1
TAIL_BYTES = 4096  # how much of each data file's end the stamp covers
_HEADER = struct.Struct("<8sIIQQQIII")
_HEADER_CRC = struct.Struct("<I")
_SEGMENT = struct.Struct("<QQQ")
_TRAILER = struct.Struct("<I")
_READ_CHUNK = 8 << 20  # bytes read (and CRC'd) per call: bounds the extra memory of a load


def index_path(directory: str, gen: int) -> str:
    return os.path.join(directory, f"data-{gen:06d}.idx")


def _tail_crc(fd: int, size: int, start: int) -> int:
    """CRC-32 of the last TAIL_BYTES bytes of a file (after its ``start``-byte header)."""
    begin = max(start, size - TAIL_BYTES)
    return zlib.crc32(os.pread(fd, size - begin, begin)) if size > begin else 0


def save(
    directory: str,
    gen: int,
    index: HashIndex,
    *,
    key_fd: int,
    key_size: int,
    val_fd: int,
    val_size: int,
    header_size: int,
) -> None:
    """Write ``index`` as ``data-<gen>.idx`` (tmp + rename), stamped with the files' state."""
    final = index_path(directory, gen)
    tmp = final + ".tmp"
    segs = list(index._segs)
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        index.width,
        gen,
        key_size,
        val_size,
        _tail_crc(key_fd, key_size, header_size),
        _tail_crc(val_fd, val_size, header_size),
        len(segs),
    )
    head += _HEADER_CRC.pack(zlib.crc32(head))
    table = b"".join(_SEGMENT.pack(s.cap, s.live, s.deleted) for s in segs)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        crc = 0
        for part in (head, table, *(buf for s in segs for buf in (s.kmv, s.vmv))):
            view = memoryview(part)
            crc = zlib.crc32(view, crc)
            while view:
                view = view[os.write(fd, view) :]
        os.write(fd, _TRAILER.pack(crc))
    except BaseException:
        os.close(fd)
        os.remove(tmp)
        raise
    os.close(fd)
    # No fsync: a torn or lost index after a power loss fails its CRC and is rebuilt.
    os.replace(tmp, final)


@dataclass(frozen=True, slots=True)
class FilesNow:
    """What the stamp is checked against: the data files as they are now."""

    key_fd: int
    key_size: int
    val_fd: int
    val_size: int
    header_size: int
    keyed: bool  # the VAL records name their keys (format 3): see _stamp


def load(directory: str, gen: int, width: int, files: FilesNow) -> HashIndex | None:
    """The index saved for exactly these files, or None (missing, stale or damaged)."""
    return _with_index_file(directory, gen, lambda fd, path: _load(fd, path, gen, width, files))


def trusted(directory: str, gen: int, width: int, files: FilesNow) -> bool:
    """Whether ``load`` would use the saved index (so an open cuts and mends nothing),
    checked without building the table: the file's CRC is read in chunks."""
    found = _with_index_file(directory, gen, lambda fd, path: _check(fd, path, gen, width, files))
    return bool(found)


def _with_index_file(directory: str, gen: int, read: Callable[[int, str], _T]) -> _T | None:
    path = index_path(directory, gen)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("%s: cannot read the saved index (%s); rebuilding it", path, exc)
        return None
    try:
        return read(fd, path)
    except OSError as exc:
        _stale(path, f"cannot read it: {exc}")
    except _Stale as exc:
        _stale(path, str(exc))
    finally:
        os.close(fd)
    return None


def _stamp(
    fd: int, path: str, gen: int, width: int, files: FilesNow
) -> tuple[bytes, list[tuple[int, int, int]], bool]:
    """(header, segment shapes, rotted) if the stamp describes ``files``; else _Stale.

    ``rotted``: same lengths and the same KEY tail but not the same VAL tail.
    Nothing was appended or cut since the clean close (which synced both files
    before it saved the index): VAL bytes changed in place. That is rot, not a
    torn write, and a rebuild would cut it as one (with every record after it).
    In a keyed store each get checks its record's CRC and key, so the index
    stays the truth; in an older one it is not used."""
    file_size = os.fstat(fd).st_size
    head = os.pread(fd, _HEADER.size + _HEADER_CRC.size, 0)
    if len(head) < _HEADER.size + _HEADER_CRC.size:
        raise _Stale("truncated header")
    (magic, version, w, g, ksize, vsize, kcrc, vcrc, nseg) = _HEADER.unpack_from(head)
    (hcrc,) = _HEADER_CRC.unpack_from(head, _HEADER.size)
    if magic != MAGIC or version != VERSION or zlib.crc32(head[: _HEADER.size]) != hcrc:
        raise _Stale("not an index file of this version, or a damaged header")
    if w != width or nseg != NUM_SEGMENTS:
        raise _Stale(f"slot width {w} / {nseg} segments, expected {width} / {NUM_SEGMENTS}")
    if (g, ksize, vsize) != (gen, files.key_size, files.val_size):
        raise _Stale("written for other data files (a crash or a compaction since)")
    if kcrc != _tail_crc(files.key_fd, files.key_size, files.header_size):
        raise _Stale("the data files' tails differ from when it was written")
    rotted = vcrc != _tail_crc(files.val_fd, files.val_size, files.header_size)
    if rotted and not files.keyed:
        raise _Stale("the data files' tails differ from when it was written")
    table = os.pread(fd, nseg * _SEGMENT.size, len(head))
    if len(table) != nseg * _SEGMENT.size:
        raise _Stale("truncated segment table")
    shapes = [_SEGMENT.unpack_from(table, i * _SEGMENT.size) for i in range(nseg)]
    expect = len(head) + len(table) + sum(c * (16 + width) for c, _, _ in shapes) + _TRAILER.size
    if expect != file_size or any(
        not (live + deleted < cap and cap > 1) for cap, live, deleted in shapes
    ):
        raise _Stale("segment table does not match the file's size")
    return head + table, shapes, rotted


def _check(fd: int, path: str, gen: int, width: int, files: FilesNow) -> bool:
    _stamp(fd, path, gen, width, files)
    end = os.fstat(fd).st_size - _TRAILER.size
    crc, pos = 0, 0
    while pos < end:
        part = os.pread(fd, min(_READ_CHUNK, end - pos), pos)
        if not part:
            raise _Stale("truncated slots")
        crc = zlib.crc32(part, crc)
        pos += len(part)
    trailer = os.pread(fd, _TRAILER.size, end)
    if len(trailer) != _TRAILER.size or _TRAILER.unpack(trailer)[0] != crc:
        raise _Stale("checksum mismatch")
    return True


def _load(fd: int, path: str, gen: int, width: int, files: FilesNow) -> HashIndex:
    start, shapes, rotted = _stamp(fd, path, gen, width, files)
    crc = zlib.crc32(start)
    segs = []
    pos = len(start)
    for cap, live, deleted in shapes:
        seg = _Segment(cap, width)
        for buf in (seg.kmv, seg.vmv):
            view = memoryview(buf)
            for begin in range(0, len(view), _READ_CHUNK):
                part = view[begin : begin + _READ_CHUNK]
                got = os.preadv(fd, [part], pos)
                if got != len(part):
                    raise _Stale("truncated slots")
                crc = zlib.crc32(part, crc)
                pos += got
        seg.live, seg.deleted = live, deleted
        segs.append(seg)
    trailer = os.pread(fd, _TRAILER.size, pos)
    if len(trailer) != _TRAILER.size or _TRAILER.unpack(trailer)[0] != crc:
        raise _Stale("checksum mismatch")
    if rotted:
        log.warning("%s: the VAL file's last %d bytes changed in place since the clean "
                    "close (lengths unchanged): damage, not a torn write; nothing is cut. "
                    "python -m kvstore verify %s names the record", path, TAIL_BYTES,
                    os.path.dirname(path))
    index = HashIndex(width)
    index._segs = segs
    return index


def saved_sizes(directory: str, gen: int) -> tuple[int, int] | None:
    """(KEY length, VAL length) of generation ``gen`` at the clean close that saved its
    index, if an index with a sound header is there; else None. Data files only grow,
    so files shorter than this lost records (``verify`` says so)."""
    try:
        with open(index_path(directory, gen), "rb") as f:
            head = f.read(_HEADER.size + _HEADER_CRC.size)
    except OSError:
        return None
    if len(head) < _HEADER.size + _HEADER_CRC.size:
        return None
    (magic, version, _w, g, ksize, vsize, _kc, _vc, _n) = _HEADER.unpack_from(head)
    (hcrc,) = _HEADER_CRC.unpack_from(head, _HEADER.size)
    if magic != MAGIC or version != VERSION or zlib.crc32(head[: _HEADER.size]) != hcrc:
        return None
    return (int(ksize), int(vsize)) if g == gen else None


class _Stale(Exception):  # noqa: N818 - never leaves this module
    """Why the saved index is not used (raised by the readers, logged by the caller)."""


def _stale(path: str, why: str) -> None:
    """Log why the saved index is not used."""
    log.info("%s: saved index not used (%s); rebuilding it from the KEY file", path, why)
    return None
