"""A store directory on disk: the writer lock, generations, and one generation's files.

Theory of operation
-------------------
A store directory holds ``LOCK`` and one generation of ``data-<gen>.key`` /
``data-<gen>.val``. A writer holds an flock on the directory itself
(``acquire_lock``); ``LOCK`` is kept for older releases' writers. New files
are written as ``*.tmp`` and renamed into place, so a generation appears only
once its headers (or, for compaction, its whole contents) are on disk. The
current generation is the highest one whose KEY and VAL files both exist;
anything else a crash left behind (``*.tmp``, older generations, a
half-renamed newer one) is deleted by the next writer.

KEY records are read in bounded chunks (``iter_key_records``), never the whole
file. What an open does with them after a crash is ``_recovery``'s job.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
from collections.abc import Iterator

import numpy as np

from . import _format as fmt
from .exceptions import (
    CorruptStoreError,
    NotAStoreError,
    StoreLockedError,
    StoreNotFoundError,
    StorePermissionError,
)

LOCK_NAME = "LOCK"
_DATA_RE = re.compile(r"^data-(\d{6,})\.(key|val|idx)(\.tmp)?$")  # idx: the saved index
CHUNK_RECORDS = 1 << 20  # KEY records read at a time on open (24 MiB)


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
    """Write all of ``data``. Its views are released on the way out, an error included:
    a traceback that kept one would pin ``data`` (a bytearray could not grow, an mmap
    could not close: "cannot close exported pointers exist" on a full disk)."""
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            rest = view[n:]
            view.release()
            view = rest
    finally:
        view.release()


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


class WriterLock:
    """The writer lock of one store while it is held: the flock on its directory and the
    one on ``LOCK`` (either fd -1 where it is not held). ``close()`` releases both;
    idempotent."""

    __slots__ = ("dir_fd", "file_fd")

    def __init__(self, dir_fd: int, file_fd: int) -> None:
        self.dir_fd, self.file_fd = dir_fd, file_fd

    def close(self) -> None:
        for name in ("file_fd", "dir_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)  # closing the fd drops its flock


def acquire_lock(path: str) -> WriterLock:
    """Take the exclusive writer lock of the store in directory ``path``.

    The lock is an ``flock`` on the store directory itself: a directory cannot be
    deleted while it holds files, so no file a user might remove by mistake (``LOCK``,
    a saved index) lets a second writer in, and a compaction's generation swap leaves
    it alone. flock is per open file description, so a second writer in the same
    process is refused too, and closing some other fd of the directory (``fsync_dir``)
    does not drop it.

    ``LOCK`` is still created and its flock held too, for writers of older kvstore
    releases, which lock only ``LOCK``: one of them already open is refused here, and
    one that opens later is refused by it (unless ``LOCK`` was deleted meanwhile; see
    docs/FORMAT.md). Where a directory cannot be flocked (NFS emulates flock with fcntl
    locks, which need a writable fd), the lock is ``LOCK`` alone, as before.
    """
    try:
        fd = _flock(path, path, os.O_RDONLY | os.O_DIRECTORY, "the store directory")
    except StorePermissionError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_DIRECTORY_FLOCK:
            raise
        return WriterLock(-1, _lock_file(path))
    try:
        return WriterLock(fd, _lock_file(path))  # an older kvstore's writer holds LOCK alone
    except BaseException:
        os.close(fd)
        raise


# What flock on a directory raises where the file system cannot lock one.
_NO_DIRECTORY_FLOCK = frozenset({errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP})


def _lock_file(path: str) -> int:
    """Take the flock on ``path/LOCK`` (created if missing); return its fd."""
    return _flock(path, os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_CREAT, "lock file")


def _flock(store: str, target: str, flags: int, what: str) -> int:
    """Open ``target`` and take its exclusive flock without waiting; return the fd.
    StoreLockedError when another writer of ``store`` holds it; any other failure of the
    flock is raised as it is, the fd closed."""
    try:
        fd = os.open(target, flags, 0o644)
    except PermissionError as exc:
        raise StorePermissionError(
            exc.errno, f"cannot open {what}: {exc.strerror}", target
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(store) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def find_generation(path: str) -> tuple[int | None, list[str]]:
    """Return (current generation or None, leftover file names to delete)."""
    keys: set[int] = set()
    vals: set[int] = set()
    names = os.listdir(path)
    for name in names:
        m = _DATA_RE.match(name)
        if m and not m.group(3) and m.group(2) != "idx":
            (keys if m.group(2) == "key" else vals).add(int(m.group(1)))
    complete = keys & vals
    current = max(complete) if complete else None
    leftovers = []
    for name in names:
        m = _DATA_RE.match(name)
        if m and (m.group(3) or int(m.group(1)) != current):
            leftovers.append(name)
    return current, leftovers


def stamp(path: str) -> tuple[int, int, int] | None:
    """(generation, KEY file bytes, VAL file bytes) of the store in directory ``path``,
    without opening it; None when there is no store there. A store only appends and a
    compaction starts a new generation, so an unchanged stamp means unchanged contents:
    a cheap test of "did anyone write since" for a reader that keeps derived numbers.
    Raises FileNotFoundError when a compaction replaced the files while they were
    looked at (ask again)."""
    try:
        gen, _ = find_generation(path)
    except FileNotFoundError:
        return None
    if gen is None:
        return None
    key_path, val_path = data_paths(path, gen)
    return gen, os.stat(key_path).st_size, os.stat(val_path).st_size


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

    ``map_values=False``: VAL is never mapped and every read is a pread. A mapped
    page that a read touched stays in the process's RSS until the map goes, so a
    process that reads a file much larger than what it keeps using (a crawl's
    PendDB, read whole at open) would hold the file; read by pread, the same pages
    are only the kernel's page cache.
    """

    def __init__(
        self, directory: str, gen: int, readonly: bool, *, map_values: bool = True
    ) -> None:
        self.directory = directory
        self.gen = gen
        self.map_values = map_values
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
        self.version = fmt.FORMAT_VERSION  # what the headers say: check_headers reads it

    @property
    def keyed(self) -> bool:
        """Whether VAL records name their keys (format 3 on; see _format)."""
        return self.version >= fmt.KEYED_VERSION

    @property
    def record_header_size(self) -> int:
        return fmt.RECORD_HEADER_SIZE if self.keyed else fmt.VAL_HEADER_SIZE

    def remap(self, length: int) -> tuple[mmap.mmap | None, int]:
        """Map the first ``length`` bytes of VAL (all of them on disk) for reads; nothing
        without ``map_values`` (reads then pread)."""
        mapped = length and self.map_values
        mm = mmap.mmap(self.val_fd, length, access=mmap.ACCESS_READ) if mapped else None
        self.mm = (mm, length if mm is not None else 0)
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


def read_key_records(
    fd: int, first: int, count: int, out: np.ndarray | None = None
) -> np.ndarray:
    """KEY records ``first`` .. ``first + count - 1`` (fewer at the end of the file),
    into ``out`` (at least ``count`` records) if given."""
    recs = np.empty(count, dtype=fmt.KEY_RECORD_DTYPE) if out is None else out[:count]
    buf = recs.view(np.uint8).data
    total = count * fmt.KEY_RECORD_SIZE
    base = fmt.HEADER_SIZE + first * fmt.KEY_RECORD_SIZE
    pos = 0
    while pos < total:
        got = os.preadv(fd, [buf[pos:]], base + pos)
        if not got:
            break
        pos += got
    buf.release()
    return recs[: pos // fmt.KEY_RECORD_SIZE]


def iter_key_records(
    fd: int, first: int, stop: int, chunk_records: int, *, reuse: bool = False
) -> Iterator[tuple[int, np.ndarray]]:
    """(index of the first, records) for KEY records ``first`` .. ``stop - 1``, in chunks.

    With ``reuse`` every chunk is read into one buffer, so a chunk is only valid
    until the next one is read: for scans that keep nothing of it.
    """
    out = None
    if reuse:
        out = np.empty(min(chunk_records, max(stop - first, 0)), fmt.KEY_RECORD_DTYPE)
    for start in range(first, stop, chunk_records):
        count = min(chunk_records, stop - start)
        recs = read_key_records(fd, start, count, out)
        short = len(recs) < count
        if len(recs):
            yield start, recs
        del recs  # before the next read: one chunk alive at a time
        if short:
            return


def check_headers(files: DataFiles) -> None:
    """Check both headers; note the format version in ``files.version``."""
    key_hdr = os.pread(files.key_fd, fmt.HEADER_SIZE, 0)
    val_hdr = os.pread(files.val_fd, fmt.HEADER_SIZE, 0)
    kgen, kver = fmt.unpack_header_version(key_hdr, fmt.KEY_MAGIC, files.key_path)
    vgen, vver = fmt.unpack_header_version(val_hdr, fmt.VAL_MAGIC, files.val_path)
    if kgen != files.gen or vgen != files.gen:
        raise CorruptStoreError(
            files.key_path,
            16,
            f"generation mismatch: file name says {files.gen}, "
            f"KEY header {kgen}, VAL header {vgen}",
        )
    if kver != vver:  # the VAL layout follows the version: the pair must agree
        raise CorruptStoreError(
            files.key_path, 8, f"format version mismatch: KEY file {kver}, VAL file {vver}"
        )
    files.version = kver
