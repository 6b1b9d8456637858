"""kvstore: an append-only key-value store with an in-memory numpy index.

Keys are 16 bytes (``md5_key`` makes one from anything); values are bytes.
``exists`` never touches the disk, a put is a buffered append, a get is one
read, a delete appends a tombstone, and ``random_key`` costs no disk access.

    import kvstore
    with kvstore.open("data/main") as db:
        db[kvstore.md5_key("http://example.com/")] = b"<html>..."

See docs/FORMAT.md for the on-disk format and docs/CLI.md for
``python -m kvstore``.
"""

from __future__ import annotations

import os

from . import exceptions
from ._backend import BACKEND
from ._datafiles import stamp
from ._format import FORMAT_VERSION, KEY_SIZE, md5_key
from ._index import release_freed_memory
from ._keysets import KeyIntMap, KeySet
from ._recovery import Recovery, TornTail
from ._repair import RepairReport, repair
from ._stats import StoreStats
from ._store import (
    DEFAULT_BUFFER_SIZE,
    DEFAULT_MAX_VALUE_SIZE,
    DEFAULT_TAIL_CHECK_BYTES,
    Store,
)
from ._verify import Damage, VerifyReport
from ._versionreader import VersionReader

__all__ = [
    "BACKEND",
    "DEFAULT_BUFFER_SIZE",
    "DEFAULT_MAX_VALUE_SIZE",
    "DEFAULT_TAIL_CHECK_BYTES",
    "FORMAT_VERSION",
    "KEY_SIZE",
    "Damage",
    "KeyIntMap",
    "KeySet",
    "Recovery",
    "RepairReport",
    "Store",
    "StoreStats",
    "TornTail",
    "VerifyReport",
    "VersionReader",
    "exceptions",
    "md5_key",
    "open",
    "release_freed_memory",
    "repair",
    "stamp",
]


def open(  # noqa: A001 - the natural name, as in dbm.open and shelve.open
    path: str | os.PathLike[str],
    *,
    readonly: bool = False,
    capacity: int | None = None,
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
    tail_check_bytes: int = DEFAULT_TAIL_CHECK_BYTES,
    map_values: bool = True,
) -> Store:
    """Open (a writer creates) the store in directory ``path``.

    ``capacity`` hints how many keys to expect, so the index is sized once.
    ``buffer_size`` is how many bytes of appends are buffered before an
    automatic flush. ``tail_check_bytes``: on open, the records in this many
    final bytes of the VAL file are CRC-checked (``verify()`` checks all).
    A writer holds an exclusive lock; read-only opens take none and see the
    records flushed before they opened. ``map_values=False``: values are read by
    pread, never through a map of the VAL file, so pages a read touched are not
    left in the process's RSS (for a process that reads a file much larger than
    what it keeps using; a get costs a system call more).
    """
    return Store(
        path,
        readonly=readonly,
        capacity=capacity,
        max_value_size=max_value_size,
        buffer_size=buffer_size,
        tail_check_bytes=tail_check_bytes,
        map_values=map_values,
    )
