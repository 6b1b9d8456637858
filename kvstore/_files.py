"""A store directory on disk: the writer lock, generations, and recovery on open.

Theory of operation
-------------------
A store directory holds ``LOCK`` and one generation of ``data-<gen>.key`` /
``data-<gen>.val``. New files are written as ``*.tmp`` and renamed into place,
so a generation appears only once its headers (or, for compaction, its whole
contents) are on disk. The current generation is the highest one whose KEY
and VAL files both exist; anything else a crash left behind (``*.tmp``, older
generations, a half-renamed newer one) is deleted by the next writer.

Recovery is point in time. Because values are appended before the KEY
records that point at them, the records a torn write can damage are a suffix
of the KEY file: a partial last record, records pointing past VAL's end, and
(within the last ``tail_check_bytes`` of VAL) records whose CRC fails. The
first such record and everything after it are dropped. A writer truncates
both files to that point, keeping a copy of the cut bytes in ``recovered/``;
a read-only open only ignores them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from . import _format as fmt
from .exceptions import (
    CorruptStoreError,
    NotAStoreError,
    StoreLockedError,
    StoreNotFoundError,
    StorePermissionError,
)

log = logging.getLogger(__name__)

LOCK_NAME = "LOCK"
RECOVERED_DIR = "recovered"
_DATA_RE = re.compile(r"^data-(\d{6,})\.(key|val)(\.tmp)?$")


def data_paths(directory: str, gen: int) -> tuple[str, str]:
    return (
        os.path.join(directory, f"data-{gen:06d}.key"),
        os.path.join(directory, f"data-{gen:06d}.val"),
    )


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def prepare_directory(path: str, readonly: bool) -> None:
    """Check that ``path`` can be a store; create it for a writer."""
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotAStoreError(f"{path}: exists and is not a directory, so it cannot be a store")
        if not os.path.exists(path):
            if readonly:
                raise StoreNotFoundError(errno.ENOENT, "no store at this path", path)
            os.makedirs(path, exist_ok=True)
        os.listdir(path)  # raises PermissionError early, with the path in it
    except PermissionError as exc:
        raise StorePermissionError(exc.errno, f"permission denied: {exc.strerror}", path) from exc


def acquire_lock(path: str) -> int:
    """Take the exclusive writer lock; return its fd. flock is per open file, so
    a second writer in the same process is refused too."""
    lock_path = os.path.join(path, LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError as exc:
        raise StorePermissionError(
            exc.errno, f"cannot open lock file: {exc.strerror}", lock_path
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(path) from None
    return fd


def find_generation(path: str) -> tuple[int | None, list[str]]:
    """Return (current generation or None, leftover file names to delete)."""
    keys: set[int] = set()
    vals: set[int] = set()
    names = os.listdir(path)
    for name in names:
        m = _DATA_RE.match(name)
        if m and not m.group(3):
            (keys if m.group(2) == "key" else vals).add(int(m.group(1)))
    complete = keys & vals
    current = max(complete) if complete else None
    leftovers = []
    for name in names:
        m = _DATA_RE.match(name)
        if m and (m.group(3) or int(m.group(1)) != current):
            leftovers.append(name)
    return current, leftovers


def create_generation(path: str, gen: int) -> None:
    """Write empty KEY and VAL files for ``gen`` (via tmp + rename)."""
    for final, magic in zip(data_paths(path, gen), (fmt.KEY_MAGIC, fmt.VAL_MAGIC), strict=True):
        tmp = final + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, fmt.pack_header(magic, gen))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
    fsync_dir(path)


class DataFiles:
    """One generation's open files: fds for appends and preads, an mmap for reads.

    The object is shared by reader threads after a compaction replaced it, so
    its fds are closed only when the last reference goes (``__del__``) or by
    an explicit ``close()`` at store close.
    """

    def __init__(self, directory: str, gen: int, readonly: bool) -> None:
        self.directory = directory
        self.gen = gen
        self.key_path, self.val_path = data_paths(directory, gen)
        flags = os.O_RDONLY if readonly else os.O_RDWR | os.O_APPEND
        self.key_fd = self.val_fd = -1
        try:
            self.key_fd = os.open(self.key_path, flags)
            self.val_fd = os.open(self.val_path, flags)
        except PermissionError as exc:
            self.close()
            raise StorePermissionError(
                exc.errno, f"cannot open data file: {exc.strerror}", exc.filename
            ) from exc
        self.mm: tuple[mmap.mmap | None, int] = (None, 0)

    def remap(self, length: int) -> tuple[mmap.mmap | None, int]:
        """Map the first ``length`` bytes of VAL (all of them on disk) for reads."""
        mm = mmap.mmap(self.val_fd, length, access=mmap.ACCESS_READ) if length else None
        self.mm = (mm, length)
        return self.mm

    def close(self) -> None:
        for name in ("key_fd", "val_fd"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
        mm = getattr(self, "mm", (None, 0))[0]
        self.mm = (None, 0)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a reader still holds a slice view; refcounting frees it
                pass

    def __del__(self) -> None:
        self.close()


@dataclass
class Loaded:
    """What recovery found: the valid KEY records and where VAL's data ends."""

    records: np.ndarray
    val_end: int
    dropped_records: int


def check_headers(files: DataFiles) -> None:
    key_hdr = os.pread(files.key_fd, fmt.HEADER_SIZE, 0)
    val_hdr = os.pread(files.val_fd, fmt.HEADER_SIZE, 0)
    kgen = fmt.unpack_header(key_hdr, fmt.KEY_MAGIC, files.key_path)
    vgen = fmt.unpack_header(val_hdr, fmt.VAL_MAGIC, files.val_path)
    if kgen != files.gen or vgen != files.gen:
        raise CorruptStoreError(
            files.key_path,
            16,
            f"generation mismatch: file name says {files.gen}, "
            f"KEY header {kgen}, VAL header {vgen}",
        )


def load_records(files: DataFiles, *, readonly: bool, tail_check_bytes: int) -> Loaded:
    """Read the KEY file, validate its tail against VAL, and (writer) truncate damage."""
    check_headers(files)
    key_size = os.fstat(files.key_fd).st_size
    n = (key_size - fmt.HEADER_SIZE) // fmt.KEY_RECORD_SIZE
    records = np.fromfile(
        files.key_path, dtype=fmt.KEY_RECORD_DTYPE, count=n, offset=fmt.HEADER_SIZE
    )
    n = len(records)  # the file may have been shorter by the time we read it
    # VAL is sized after KEY is read: every record we read had its value written first.
    val_size = os.fstat(files.val_fd).st_size
    offs = records["off"]
    bad = (offs < fmt.TOMBSTONE) | (
        (offs >= 0) & ((offs < fmt.HEADER_SIZE) | (offs > val_size - fmt.VAL_HEADER_SIZE))
    )
    first_bad = int(np.argmax(bad)) if bad.any() else n
    valid, val_end = _check_tail(files, offs, first_bad, val_size, tail_check_bytes)
    dropped = n - valid
    key_end = fmt.HEADER_SIZE + valid * fmt.KEY_RECORD_SIZE
    if dropped or key_end != key_size or val_end != val_size:
        log.warning(
            "%s: recovery dropped %d KEY record(s), %d torn KEY byte(s) and "
            "%d unreferenced VAL byte(s)%s",
            files.directory,
            dropped,
            key_size - fmt.HEADER_SIZE - n * fmt.KEY_RECORD_SIZE,
            val_size - val_end,
            "" if readonly else f"; cut bytes saved in {RECOVERED_DIR}/",
        )
        if not readonly:
            _truncate(files, key_end, val_end)
    return Loaded(records[:valid], val_end, dropped)


def _check_tail(
    files: DataFiles, offs: np.ndarray, limit: int, val_size: int, tail_check_bytes: int
) -> tuple[int, int]:
    """CRC-check the put records in VAL's tail; return (valid record count, VAL data end)."""
    puts = np.flatnonzero(offs[:limit] >= 0)
    if not len(puts):
        return limit, fmt.HEADER_SIZE
    start_off = min(int(offs[puts[-1]]), val_size - tail_check_bytes)
    tail = puts[offs[puts] >= start_off]
    start_off = int(offs[tail[0]])
    data = os.pread(files.val_fd, val_size - start_off, start_off)
    prev_end = start_off
    val_end = start_off
    for rec in tail.tolist():
        off = int(offs[rec])
        rel = off - start_off
        if off < prev_end or rel + fmt.VAL_HEADER_SIZE > len(data):
            return rec, val_end
        length, crc = fmt.unpack_val_header(data, rel)
        end = rel + fmt.VAL_HEADER_SIZE + length
        if end > len(data) or not fmt.value_is_intact(
            memoryview(data)[rel + fmt.VAL_HEADER_SIZE : end], crc
        ):
            return rec, val_end
        prev_end = val_end = off + fmt.VAL_HEADER_SIZE + length
    return limit, val_end


def _truncate(files: DataFiles, key_end: int, val_end: int) -> None:
    """Cut both files back to the valid point, keeping the cut bytes in recovered/."""
    rdir = os.path.join(files.directory, RECOVERED_DIR)
    os.makedirs(rdir, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
    for fd, end, suffix in ((files.key_fd, key_end, "key"), (files.val_fd, val_end, "val")):
        size = os.fstat(fd).st_size
        if size > end:
            cut = os.pread(fd, size - end, end)
            out = os.path.join(rdir, f"gen{files.gen:06d}-{stamp}-at{end}.{suffix}")
            with open(out, "wb") as f:
                f.write(cut)
                f.flush()
                os.fsync(f.fileno())
            os.ftruncate(fd, end)
            os.fsync(fd)
