"""Every error kvstore raises on purpose, under one base class.

A missing key raises the builtin ``KeyError(key)``, as any mapping does.
"""

from __future__ import annotations

import os


class KVStoreError(Exception):
    """Base class of every kvstore error."""


class InvalidKeyError(KVStoreError, ValueError):
    """A key is not exactly 16 bytes (use ``kvstore.md5_key`` to make one)."""


class ValueTooLargeError(KVStoreError, ValueError):
    """A value is larger than the store's ``max_value_size``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"value of {size} bytes exceeds max_value_size={limit}")
        self.size = size
        self.limit = limit


class StoreClosedError(KVStoreError):
    """An operation on a store that was closed."""


class ReadOnlyError(KVStoreError):
    """A write to a store opened with ``readonly=True``."""


class StoreLockedError(KVStoreError):
    """Another open writer (this process or another) holds the store's lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(
            f"{os.fspath(path)}: store is locked by another writer; "
            "close it first, or open with readonly=True"
        )
        self.path = os.fspath(path)


class StoreNotFoundError(KVStoreError, FileNotFoundError):
    """A read-only open of a path that holds no store."""


class NotAStoreError(KVStoreError):
    """The path exists but is not a store directory (e.g. it is a regular file)."""


class StorePermissionError(KVStoreError, PermissionError):
    """The store directory or its files cannot be read or written."""


class CorruptStoreError(KVStoreError):
    """Damaged data: a bad header, a newer format version, or a record whose CRC fails.

    ``path`` is the file and ``offset`` the byte position of the damage (or None).
    """

    def __init__(self, path: str | os.PathLike[str], offset: int | None, reason: str) -> None:
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{os.fspath(path)}{where}: {reason}")
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason


class UnsupportedVersionError(CorruptStoreError):
    """The file was written by a newer format version than this kvstore reads."""
