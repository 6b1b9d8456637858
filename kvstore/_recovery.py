"""Recovery on open: where the sound part of a generation ends, and the torn tail.

Theory of operation
-------------------
Recovery keeps every record it can. Because values are appended before the KEY
records that point at them, the records a torn write can damage are a suffix
of the KEY file: a partial last record, records pointing past VAL's end, and
(within the last ``tail_check_bytes`` of VAL) records that fail the check. In a
keyed generation, a KEY record that disagrees with its sound VAL record is KEY
damage, rewritten from VAL, and an unsound record that sound ones follow is
damage in the middle, kept for ``verify`` and ``repair``, and sound VAL records
past the last KEY record get their KEY records from VAL (``_mend``); only what
nothing sound follows is the torn tail. A writer cuts the tail from both files
and writes the mended records, keeping a copy of the bytes it cut or overwrote
in ``recovered/``; a read-only open only changes its view. Either way the open
logs what it did and reports it (``Loaded.recovery``, then ``Store.recovery``).

An open holds one chunk of KEY records at a time: a first pass over the KEY
file finds the torn tail, and ``Loaded.chunks()`` reads the kept records
again for the index. The CRC check of the tail is ``check_val_records`` (C, or
its pure-Python twin: see ``_backend``).

The directory, its lock and a generation's files are ``_datafiles``'.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from . import _format as fmt
from . import _mend
from ._backend import check_val_records
from ._datafiles import (
    CHUNK_RECORDS,
    DataFiles,
    check_headers,
    fsync_dir,
    iter_key_records,
    read_key_records,
    write_all,
)
from ._indexfile import index_path

__all__ = [
    "RECOVERED_DIR",
    "Loaded",
    "Recovery",
    "TailScan",
    "TornTail",
    "load_records",
    "scan_tail",
]

log = logging.getLogger(__name__)

RECOVERED_DIR = "recovered"
_COPY_PIECE = 8 << 20  # bytes copied to recovered/ per step


@dataclass(frozen=True)
class TornTail:
    """The end of a generation that a writable open cuts and a read-only open leaves out.

    The KEY file is cut at ``key_offset`` (``key_records`` complete records, of
    which ``tombstones`` are deletions, plus any partial record: ``key_bytes``
    in all); the VAL file at ``val_offset`` (``val_bytes``). ``reason`` says
    why the first cut record is unsound ("" when only a partial KEY record or
    VAL bytes no KEY record references are cut: an interrupted append).
    """

    key_offset: int
    key_records: int
    tombstones: int
    key_bytes: int
    val_offset: int
    val_bytes: int
    reason: str

    def describe(self) -> str:
        parts = []
        if self.key_records:
            among = ""
            if self.tombstones:
                among = f" (including {_count(self.tombstones, 'tombstone')})"
            parts.append(
                f"{_count(self.key_records, 'KEY record')}{among} from KEY offset {self.key_offset}"
            )
        partial = self.key_bytes - self.key_records * fmt.KEY_RECORD_SIZE
        if partial:
            at = self.key_offset + self.key_records * fmt.KEY_RECORD_SIZE
            parts.append(f"{_count(partial, 'byte')} of a partial KEY record at KEY offset {at}")
        if self.val_bytes:
            parts.append(f"{_count(self.val_bytes, 'VAL byte')} from VAL offset {self.val_offset}")
        text = " and ".join(parts)
        return f"{text}; first unsound record: {self.reason}" if self.reason else text


@dataclass(frozen=True)
class Recovery:
    """What an open changed: ``tail``, the torn tail it left out (None if none), and
    ``mended``, the KEY records it rewrote from VAL (None if none). A writer cut the
    tail from the files and wrote the mended records (``truncated``), keeping the bytes
    it cut or overwrote in the ``saved`` files; a read-only open only changed its view."""

    tail: TornTail | None
    truncated: bool
    saved: tuple[str, ...] = ()
    mended: _mend.Mended | None = None


@dataclass(frozen=True)
class TailScan:
    """Where the sound part of a generation ends: ``valid`` KEY records, VAL up to ``val_end``."""

    valid: int
    val_end: int
    tail: TornTail | None
    mend: _mend.Walk | None = None  # KEY records rewritten from VAL, damage kept in place


@dataclass
class Loaded:
    """What an open keeps: the first ``records`` KEY records (read with ``chunks()``),
    VAL up to ``val_end``, and what it left out (``recovery``, None if nothing)."""

    files: DataFiles
    records: int
    val_end: int
    recovery: Recovery | None
    chunk_records: int = CHUNK_RECORDS
    mend: _mend.Walk | None = None  # KEY records as VAL mends them, for the index
    added_in_view: bool = False  # mend.added are not in the file (a read-only open)

    @property
    def key_end(self) -> int:
        return fmt.HEADER_SIZE + self.records * fmt.KEY_RECORD_SIZE

    def chunks(self) -> Iterator[np.ndarray]:
        """The kept KEY records in file order, at most ``chunk_records`` at a time,
        read from the file again into one buffer: a chunk is valid only until the
        next one is read (so its pages are faulted in once, not once a chunk)."""
        key_fd = self.files.key_fd
        for start, recs in iter_key_records(
            key_fd, 0, self.records, self.chunk_records, reuse=True
        ):
            yield recs if self.mend is None else _mend.patch(recs, start, self.mend)
            del recs  # before the next read, which overwrites it
        if self.mend is not None and self.mend.added and self.added_in_view:
            yield self.mend.added_records()  # a writer appended them: read above


def load_records(
    files: DataFiles,
    *,
    readonly: bool,
    tail_check_bytes: int,
    chunk_records: int = CHUNK_RECORDS,
) -> Loaded:
    """Find the sound part of the generation; a writer cuts the rest (keeping a copy).

    Memory: one chunk of ``chunk_records`` KEY records at a time, never the file.
    Whatever is left out is logged and returned as ``Loaded.recovery``.
    """
    check_headers(files)
    key_size = os.fstat(files.key_fd).st_size
    # VAL is sized after KEY: every KEY record within key_size had its value written first.
    val_size = os.fstat(files.val_fd).st_size
    scan = scan_tail(files, key_size, val_size, tail_check_bytes, chunk_records)
    recovery = None
    mended = scan.mend.summary() if scan.mend is not None else None
    if scan.tail is not None or mended is not None:
        saved: tuple[str, ...] = ()
        if not readonly and scan.mend is not None and scan.mend.mends:
            saved += _write_mends(files, scan.mend)
        if not readonly and scan.tail is not None:
            key_end = fmt.HEADER_SIZE + scan.valid * fmt.KEY_RECORD_SIZE
            saved += _truncate(files, key_end, scan.val_end)
        recovery = Recovery(scan.tail, truncated=not readonly, saved=saved, mended=mended)
        _log_recovery(files, recovery)
    records = scan.valid
    if scan.mend is not None and scan.mend.added and not readonly:
        _append_added(files, scan.valid, scan.mend.added)  # after the cut of a partial one
        records += len(scan.mend.added) // fmt.KEY_RECORD_SIZE
    return Loaded(files, records, scan.val_end, recovery, chunk_records, scan.mend,
                  added_in_view=readonly)


def scan_tail(
    files: DataFiles, key_size: int, val_size: int, tail_check_bytes: int, chunk_records: int
) -> TailScan:
    """Point-in-time recovery's verdict on the first ``key_size``/``val_size`` bytes.

    A KEY record is unsound if its offset is invalid or its value's header
    lies past VAL's end (checked for every record), or, from the first put
    whose value lies in the last ``tail_check_bytes`` of VAL (or from the last
    put), if its value runs past VAL's end, fails its CRC or overlaps the
    previous one. The first unsound record and everything after it are the
    torn tail. Reads the KEY file in chunks, the VAL file only in its tail.
    """
    fd = files.key_fd
    n = (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
    threshold = max(val_size - tail_check_bytes, fmt.HEADER_SIZE)
    hsize = files.record_header_size
    n, limit, tail_first, before = _first_pass(fd, n, val_size, hsize, threshold, chunk_records)
    before_idx, before_off = before
    valid, reason = limit, ""
    val_end = fmt.HEADER_SIZE
    mend: _mend.Walk | None = None
    if files.keyed and (n > 0 or val_size > fmt.HEADER_SIZE):
        # Every KEY record has its VAL record, in the same order: walk both in step from
        # the put before the checked tail (whose end is trusted; it comes before the first
        # record whose offset cannot be right), deletions included.
        with _map_val(files, val_size) as mm:
            first = before_idx + 1 if before_idx >= 0 else 0
            if before_idx >= 0:
                val_end = min(fmt.keyed_record_end(mm, before_off), val_size)
            mend = _mend.walk(fd, mm, first, n, val_size, val_end, chunk_records)
            valid, val_end, reason = mend.valid, mend.pos, mend.reason
    elif tail_first >= 0 or limit < n:
        with _map_val(files, val_size) as mm:
            if before_off >= 0:
                val_end = _record_end(mm, before_off, val_size)
            if tail_first >= 0:
                valid, val_end, reason = _check_puts(
                    fd, mm, tail_first, limit, val_size, val_end, chunk_records
                )
            if valid == limit < n:
                reason = _unsound_reason(fd, mm, limit, val_size)
    key_end = fmt.HEADER_SIZE + valid * fmt.KEY_RECORD_SIZE
    if mend is not None and mend.summary() is None:
        mend = None
    if key_end == key_size and val_end == val_size:
        return TailScan(valid, val_end, None, mend)
    tombstones = sum(
        int(np.count_nonzero(recs["off"] == fmt.TOMBSTONE))
        for _, recs in iter_key_records(fd, valid, n, chunk_records, reuse=True)
    )
    tail = TornTail(
        key_offset=key_end,
        key_records=n - valid,
        tombstones=tombstones,
        key_bytes=key_size - key_end,
        val_offset=val_end,
        val_bytes=val_size - val_end,
        reason=reason,
    )
    return TailScan(valid, val_end, tail, mend)


def _first_pass(
    fd: int, n: int, val_size: int, hsize: int, threshold: int, chunk_records: int
) -> tuple[int, int, int, tuple[int, int]]:
    """Read the KEY file once; return (records read, the first structurally unsound
    record or that count, the first put to CRC-check or -1, (index, VAL offset) of
    the put before it or (-1, -1)). ``hsize``: the VAL record header's size."""
    limit = n
    seen = 0
    tail_first = -1  # the first put whose value lies at or after `threshold`
    before = (-1, -1)
    last = prev = (-1, -1)  # (index, VAL offset) of the last two puts before `limit`
    for start, recs in iter_key_records(fd, 0, n, chunk_records, reuse=True):
        offs = recs["off"]
        seen = start + len(offs)
        bad = (offs < fmt.TOMBSTONE) | (
            (offs >= 0) & ((offs < fmt.HEADER_SIZE) | (offs > val_size - hsize))
        )
        stop = int(np.argmax(bad)) if bad.any() else len(offs)
        del bad
        # Masks and argmax only: the temporaries stay a fraction of the chunk.
        is_put = offs[:stop] >= 0
        if tail_first < 0:
            hit = _first_true(offs[:stop] >= threshold)
            if hit >= 0:
                tail_first = start + hit
                p = _last_true(is_put[:hit])
                before = (start + p, int(offs[p])) if p >= 0 else last
        p = _last_true(is_put)
        if p >= 0:
            q = _last_true(is_put[:p])
            prev = (start + q, int(offs[q])) if q >= 0 else last
            last = (start + p, int(offs[p]))
        if stop < len(offs):
            limit = start + stop
            break
    else:
        n = limit = seen  # the file may have been shorter by the time we read it
    if tail_first < 0 and last[0] >= 0:  # no value in the tail: check the last one
        tail_first, before = last[0], prev
    return n, limit, tail_first, before


def _check_puts(
    fd: int,
    mm: mmap.mmap,
    first: int,
    stop: int,
    val_size: int,
    val_end: int,
    chunk_records: int,
) -> tuple[int, int, str]:
    """CRC-check the puts among KEY records first..stop-1; return (valid, VAL end, reason)."""
    prev_end = fmt.HEADER_SIZE
    for start, recs in iter_key_records(fd, first, stop, chunk_records, reuse=True):
        offs = recs["off"]
        puts = np.flatnonzero(offs >= 0)
        passed, end = check_val_records(mm, np.ascontiguousarray(offs[puts]), val_size, prev_end)
        if passed:
            prev_end = val_end = end
        if passed < len(puts):
            j = int(puts[passed])
            off = int(offs[j])
            problem, _ = fmt.check_val_record(mm, off, val_size, prev_end)
            key = recs["key"][j].tobytes()
            return start + j, val_end, _mend.record_reason(key, start + j, off, problem)
    return stop, val_end, ""


def _unsound_reason(fd: int, mm: mmap.mmap, index: int, val_size: int) -> str:
    """Why plain KEY record ``index`` (structurally unsound: a bad offset) is unsound."""
    rec = read_key_records(fd, index, 1)
    key, off = rec["key"][0].tobytes(), int(rec["off"][0])
    problem, _ = fmt.check_val_record(mm, off, val_size, 0)
    return _mend.record_reason(key, index, off, problem)


def _first_true(mask: np.ndarray) -> int:
    return int(np.argmax(mask)) if mask.any() else -1


def _last_true(mask: np.ndarray) -> int:
    return len(mask) - 1 - int(np.argmax(mask[::-1])) if mask.any() else -1


def _record_end(mm: mmap.mmap, off: int, val_size: int) -> int:
    """Where the (unchecked) value record at ``off`` ends, kept inside the file."""
    length, _ = fmt.unpack_val_header(mm, off)
    return min(off + fmt.VAL_HEADER_SIZE + length, val_size)


def _map_val(files: DataFiles, length: int) -> mmap.mmap:
    return mmap.mmap(files.val_fd, length, access=mmap.ACCESS_READ)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _log_recovery(files: DataFiles, rec: Recovery) -> None:
    if rec.mended is not None:
        who = "open" if rec.truncated else "read-only open (in its view only)"
        saved = "; the old KEY bytes are saved in recovered/" if (
            rec.truncated and rec.mended.records) else ""
        log.warning("%s: %s: %s%s", files.directory, who, rec.mended.describe(), saved)
    if rec.tail is None:
        return
    what = rec.tail.describe()
    if rec.truncated:
        log.warning(
            "%s: recovery cut %s; the cut bytes are saved in %s",
            files.directory,
            what,
            ", ".join(rec.saved),
        )
    elif rec.tail.key_records:
        log.warning(
            "%s: read-only open leaves out %s; a writable open would cut them",
            files.directory,
            what,
        )
    else:  # beside a live writer this is its append in progress, so no warning
        log.info("%s: read-only open ignores %s (an interrupted append?)", files.directory, what)


def _write_mends(files: DataFiles, w: _mend.Walk) -> tuple[str, ...]:
    """Write the KEY records VAL mends in place, after saving the bytes they replace
    (from the first to the last) in recovered/; drop the saved index (it is stale)."""
    first, last = min(w.mends), max(w.mends)
    start = fmt.HEADER_SIZE + first * fmt.KEY_RECORD_SIZE
    stop = fmt.HEADER_SIZE + (last + 1) * fmt.KEY_RECORD_SIZE
    rdir = os.path.join(files.directory, RECOVERED_DIR)
    os.makedirs(rdir, exist_ok=True)
    out = os.path.join(rdir, f"gen{files.gen:06d}-{recovered_stamp()}-mended-at{start}.key")
    save_range(files.key_fd, start, stop, out)
    fsync_dir(rdir)
    fd = os.open(files.key_path, os.O_WRONLY)  # the store's own fd appends (O_APPEND)
    try:
        for j, rec in sorted(w.mends.items()):
            os.pwrite(fd, rec, fmt.HEADER_SIZE + j * fmt.KEY_RECORD_SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.remove(index_path(files.directory, files.gen))
    return (out,)


def _append_added(files: DataFiles, valid: int, added: bytearray) -> None:
    """Append the KEY records of the sound VAL records past the KEY file's end (the
    file ends after ``valid`` records now), synced; the saved index is stale."""
    if os.fstat(files.key_fd).st_size != fmt.HEADER_SIZE + valid * fmt.KEY_RECORD_SIZE:
        raise OSError(f"{files.key_path}: not where recovery left it")  # never, but say so
    write_all(files.key_fd, added)
    os.fsync(files.key_fd)
    with contextlib.suppress(FileNotFoundError):
        os.remove(index_path(files.directory, files.gen))


def recovered_stamp() -> str:
    """The time part of a recovered/ file's name (unique to the nanosecond)."""
    return time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"


def save_range(fd: int, start: int, stop: int, out: str) -> None:
    """Copy bytes ``start``..``stop - 1`` of ``fd`` into a new file ``out``, synced."""
    with open(out, "wb") as f:
        for pos in range(start, stop, _COPY_PIECE):
            f.write(os.pread(fd, min(_COPY_PIECE, stop - pos), pos))
        f.flush()
        os.fsync(f.fileno())


def _truncate(files: DataFiles, key_end: int, val_end: int) -> tuple[str, ...]:
    """Cut both files back to the valid point, keeping the cut bytes in recovered/."""
    rdir = os.path.join(files.directory, RECOVERED_DIR)
    os.makedirs(rdir, exist_ok=True)
    stamp = recovered_stamp()
    saved = []
    for fd, end, suffix in ((files.key_fd, key_end, "key"), (files.val_fd, val_end, "val")):
        size = os.fstat(fd).st_size
        if size > end:
            out = os.path.join(rdir, f"gen{files.gen:06d}-{stamp}-at{end}.{suffix}")
            save_range(fd, end, size, out)
            os.ftruncate(fd, end)
            os.fsync(fd)
            saved.append(out)
    fsync_dir(rdir)
    # The index a clean close saved describes the files before the cut: it is stale now,
    # and its stamp would make verify report the cut records as lost forever.
    with contextlib.suppress(FileNotFoundError):
        os.remove(index_path(files.directory, files.gen))
    return tuple(saved)
