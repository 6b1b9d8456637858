"""An append-only file of fixed-size numpy records, for state rebuilt in memory on open.

``depths.bin`` (crawler.state.depths) and ``due.bin`` (crawler.state.revisits)
are such logs: each record is a url_key and a number, later records of a key
replace earlier ones, and the in-memory map is the log read from the start.
Appends are flushed to the OS at once (a kill -9 loses none) and fsynced with
the other stores. A record cut by a kill (the file's size is not a whole number
of records) is ignored on open and cut off before the next append.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

__all__ = ["RecordLog", "keys_of", "read_chunks"]

_CHUNK = 1 << 20  # records read at a time on open: memory stays bounded


class RecordLog:
    """The log at ``path`` of (url_key, ``field``) records, ``field`` of numpy type
    ``kind``. Not thread-safe, except ``sync`` (an fsync beside the appends, from the
    frontier's syncer)."""

    def __init__(self, path: str, field: str, kind: str | np.dtype) -> None:
        self.path = path
        self.field = field
        self.dtype = dtype = np.dtype([("key", "V16"), (field, kind)])
        self._staged: list[tuple[bytes, int]] = []
        size = os.path.getsize(path) if os.path.exists(path) else 0
        self.whole = size - size % dtype.itemsize  # bytes of whole records
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - closed by close()
        if self._file.tell() != self.whole:  # a record cut by a kill
            self._file.truncate(self.whole)
            self._file.seek(self.whole)

    def chunks(self) -> Iterator[np.ndarray]:
        """The records on disk at open, oldest first, a bounded chunk at a time."""
        return read_chunks(self.path, self.dtype, self.whole)

    def stage(self, items: Iterable[tuple[bytes, int]]) -> None:
        """(key, value) records for the next ``write``."""
        self._staged += items

    def append(self, records: np.ndarray) -> None:
        """Append ``records`` (of this log's dtype) and flush them to the OS (raises
        OSError, a full disk)."""
        if len(records):
            self._file.write(records.astype(self.dtype, copy=False).tobytes())
            self._file.flush()

    def write(self) -> None:
        """Append the staged records and flush them to the OS (raises OSError, a full
        disk: they are dropped, as the commit that staged them failed)."""
        items, self._staged = self._staged, []
        if items:
            rec = np.empty(len(items), dtype=self.dtype)
            rec["key"] = np.frombuffer(b"".join(k for k, _ in items), dtype="V16")
            rec[self.field] = [v for _, v in items]
            self._file.write(rec.tobytes())
            self._file.flush()

    def sync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def abandon(self) -> None:
        """Close without writing more (after a failed write: the tail may be cut)."""
        try:
            self._file.close()
        except OSError:
            pass


def read_chunks(path: str, dtype: np.dtype, size: int | None = None,
                start: int = 0) -> Iterator[np.ndarray]:
    """The whole records of the log at ``path`` (its first ``size`` bytes; None: as it is
    now; from byte ``start``, a record boundary), oldest first, a bounded chunk at a
    time: a reader that writes nothing, beside a writer (a record the writer is
    appending is not whole yet, and not read)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        total = os.fstat(f.fileno()).st_size if size is None else size
        whole = total - total % dtype.itemsize
        step = _CHUNK * dtype.itemsize
        done = start
        f.seek(start)
        while done < whole:
            want = min(step, whole - done)
            data = f.read(want)
            n = len(data) - len(data) % dtype.itemsize
            if n:
                yield np.frombuffer(data[:n], dtype=dtype)
            if len(data) < want:
                return  # cut under us (a writer truncating a torn tail)
            done += n


def keys_of(records: np.ndarray) -> np.ndarray:
    """The ``key`` field (16 bytes) of records as the (n, 16) uint8 array maps take."""
    return np.frombuffer(records["key"].tobytes(), dtype=np.uint8).reshape(-1, 16)
