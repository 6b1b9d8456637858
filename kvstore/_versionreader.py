"""Values read by the versions ``Store.versions()`` gives, with no index in memory.

A process that reads many records named by a snapshot (the search indexer's reading
workers) needs no key index: a version is where the record is. Opening the store would
load every key (about 29 bytes each: ~0.6 GB at 21M records, in each such process);
a VersionReader opens the generation's files only.

A version names a record of one generation (``versions()`` returns it), and only that
generation's files hold it: the reader opens them at once and keeps them open, so a
compaction that replaces the generation afterwards does not disturb its reads (the
replaced files live on until it closes). The store's writer may go on writing: records
are appended, never moved.

Thread safety: reads are preads, safe from any number of threads.
"""

from __future__ import annotations

import os

from ._datafiles import DataFiles, check_headers
from ._fallback import check_key
from ._reader import read_at
from .exceptions import StoreNotFoundError


class VersionReader:
    """Generation ``generation`` of the store in ``path``, read by (key, version)."""

    def __init__(self, path: str | os.PathLike[str], generation: int) -> None:
        self.path = os.fspath(path)
        self.generation = generation
        try:
            self._files = DataFiles(self.path, generation, readonly=True)
        except FileNotFoundError:
            raise StoreNotFoundError(
                2, f"no generation {generation} here (compacted since?)", self.path
            ) from None
        try:
            check_headers(self._files)
        except BaseException:
            self._files.close()
            raise

    def get(self, key: bytes, version: int) -> bytes:
        """The value ``key`` had at ``version`` (one of ``versions()``'s, this generation's):
        checked as a get checks it, its CRC and, in a keyed generation, that the record
        there is ``key``'s (CorruptStoreError otherwise). KeyError for a negative version
        (``versions_of``'s for an absent key)."""
        key = check_key(key)
        if version < 0:
            raise KeyError(key)
        return read_at(self._files, version, key)

    def close(self) -> None:
        self._files.close()

    def __enter__(self) -> VersionReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["VersionReader"]
