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
  another of the same length is caught);
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

from ._index import NUM_SEGMENTS, HashIndex, _Segment

log = logging.getLogger(__name__)

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


def load(
    directory: str,
    gen: int,
    width: int,
    *,
    key_fd: int,
    key_size: int,
    val_fd: int,
    val_size: int,
    header_size: int,
) -> HashIndex | None:
    """The index saved for exactly these files, or None (missing, stale or damaged)."""
    path = index_path(directory, gen)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("%s: cannot read the saved index (%s); rebuilding it", path, exc)
        return None
    try:
        return _load(fd, path, gen, width, key_fd, key_size, val_fd, val_size, header_size)
    except OSError as exc:
        return _stale(path, f"cannot read it: {exc}")
    finally:
        os.close(fd)


def _load(
    fd: int,
    path: str,
    gen: int,
    width: int,
    key_fd: int,
    key_size: int,
    val_fd: int,
    val_size: int,
    header_size: int,
) -> HashIndex | None:
    file_size = os.fstat(fd).st_size
    head = os.pread(fd, _HEADER.size + _HEADER_CRC.size, 0)
    if len(head) < _HEADER.size + _HEADER_CRC.size:
        return _stale(path, "truncated header")
    (magic, version, w, g, ksize, vsize, kcrc, vcrc, nseg) = _HEADER.unpack_from(head)
    (hcrc,) = _HEADER_CRC.unpack_from(head, _HEADER.size)
    if magic != MAGIC or version != VERSION or zlib.crc32(head[: _HEADER.size]) != hcrc:
        return _stale(path, "not an index file of this version, or a damaged header")
    if w != width or nseg != NUM_SEGMENTS:
        return _stale(path, f"slot width {w} / {nseg} segments, expected {width} / {NUM_SEGMENTS}")
    if (g, ksize, vsize) != (gen, key_size, val_size):
        return _stale(path, "written for other data files (a crash or a compaction since)")
    if (kcrc, vcrc) != (
        _tail_crc(key_fd, key_size, header_size),
        _tail_crc(val_fd, val_size, header_size),
    ):
        return _stale(path, "the data files' tails differ from when it was written")
    table = os.pread(fd, nseg * _SEGMENT.size, len(head))
    if len(table) != nseg * _SEGMENT.size:
        return _stale(path, "truncated segment table")
    shapes = [_SEGMENT.unpack_from(table, i * _SEGMENT.size) for i in range(nseg)]
    expect = len(head) + len(table) + sum(c * (16 + width) for c, _, _ in shapes) + _TRAILER.size
    if expect != file_size or any(
        not (live + deleted < cap and cap > 1) for cap, live, deleted in shapes
    ):
        return _stale(path, "segment table does not match the file's size")
    crc = zlib.crc32(table, zlib.crc32(head))
    segs = []
    pos = len(head) + len(table)
    for cap, live, deleted in shapes:
        seg = _Segment(cap, width)
        for buf in (seg.kmv, seg.vmv):
            view = memoryview(buf)
            for start in range(0, len(view), _READ_CHUNK):
                part = view[start : start + _READ_CHUNK]
                got = os.preadv(fd, [part], pos)
                if got != len(part):
                    return _stale(path, "truncated slots")
                crc = zlib.crc32(part, crc)
                pos += got
        seg.live, seg.deleted = live, deleted
        segs.append(seg)
    trailer = os.pread(fd, _TRAILER.size, pos)
    if len(trailer) != _TRAILER.size or _TRAILER.unpack(trailer)[0] != crc:
        return _stale(path, "checksum mismatch")
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


def _stale(path: str, why: str) -> HashIndex | None:
    """Log why the saved index is not used; always None (so loaders can return it)."""
    log.info("%s: saved index not used (%s); rebuilding it from the KEY file", path, why)
    return None
