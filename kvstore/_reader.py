"""The slow path of a get: one VAL record read from a generation, and checked.

The common cases (a value in the write buffer or inside the map) run in C, or in
the pure twin, which both call ``read_value`` for everything else: a value past the
mapped part (pread, or a remap once enough is unmapped), a record past the end of the
file, and every check that fails, so the errors exist once.

A record read back must be intact (its CRC) and, in a keyed generation (format 3,
see _format), its key's own: a damaged KEY offset that leads to another key's record,
CRC-valid, raises CorruptStoreError instead of handing out another key's value.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING

from . import _format as fmt
from ._fallback import REMAP_SLACK
from .exceptions import CorruptStoreError

if TYPE_CHECKING:
    from ._datafiles import DataFiles
    from ._open import _Generation


def read_value(g: _Generation, off: int, key: bytes) -> bytes:
    """The value of ``key``'s record at VAL offset ``off`` of generation ``g``. Lock-free."""
    base, buf = g.wbuf
    files = g.files
    hsize = fmt.RECORD_HEADER_SIZE if g.keyed else fmt.VAL_HEADER_SIZE
    if off >= base:
        rel = off - base
        head = bytes(buf[rel : rel + hsize])
        length = _record_length(files, head, off)
        value = bytes(buf[rel + hsize : rel + hsize + length])
    else:
        mm, mlen = files.mm
        if base - mlen > REMAP_SLACK:
            mm, mlen = files.remap(base)
        if off + hsize <= mlen and mm is not None:
            head = mm[off : off + hsize]
            length = _record_length(files, head, off)
            end = off + hsize + length
            if end <= mlen:
                value = mm[off + hsize : end]
            else:
                value = os.pread(files.val_fd, length, off + hsize)
        else:
            return read_at(files, off, key)
    _check_crc(files, head, value, length, off)
    _check_owner(files, head, key, off)
    return value


def read_at(files: DataFiles, off: int, key: bytes) -> bytes:
    """The value of ``key``'s record at VAL offset ``off`` of ``files``, read from the
    file (one pread; two for a value over 4 KiB) and checked as a get checks it."""
    hsize = files.record_header_size
    head = os.pread(files.val_fd, hsize + 4096, off)
    length = _record_length(files, head, off)
    value = head[hsize : hsize + length]
    if len(value) < length:
        value += os.pread(files.val_fd, length - len(value), off + hsize + len(value))
    head = head[:hsize]
    _check_crc(files, head, value, length, off)
    _check_owner(files, head, key, off)
    return value


# A prefix read larger than this reads the record's header first, so that a huge n (a
# damaged length field in the caller's data) never allocates more than the value.
_ONE_READ_MAX = 1 << 16


def read_prefix(g: _Generation, off: int, key: bytes, n: int) -> bytes:
    """The first ``min(n, length)`` bytes of ``key``'s value at VAL offset ``off``: one
    pread of the record's header and ``n`` bytes (none if still buffered; two for an ``n``
    over ``_ONE_READ_MAX``). The record
    must be its key's own (keyed generations), as for a get; its CRC, which covers the
    whole value, is checked only when those ``n`` bytes hold all of it. Lock-free."""
    base, buf = g.wbuf
    hsize = fmt.RECORD_HEADER_SIZE if g.keyed else fmt.VAL_HEADER_SIZE
    if off >= base:
        rel = off - base
        chunk = bytes(buf[rel : rel + hsize + n])
    else:  # records before ``base`` are in the file: flush writes before it moves base
        if n > _ONE_READ_MAX:  # pread allocates n bytes first: learn the length before
            head = os.pread(g.files.val_fd, hsize, off)
            n = min(n, _record_length(g.files, head, off))
        chunk = os.pread(g.files.val_fd, hsize + n, off)
    head = chunk[:hsize]
    length = _record_length(g.files, head, off)
    value = chunk[hsize : hsize + min(n, length)]
    if n >= length:  # the whole value: checked exactly as a get checks it
        _check_crc(g.files, head, value, length, off)
    elif len(value) < n:
        raise CorruptStoreError(g.files.val_path, off, "value record runs past the end of the file")
    _check_owner(g.files, head, key, off)
    return value


def _check_crc(files: DataFiles, head: bytes, value: bytes, length: int, off: int) -> None:
    _, crc = fmt.VAL_HEADER.unpack_from(head)
    if files.keyed:
        intact = len(value) == length and fmt.keyed_crc(length, head[8:], value) == crc
    else:
        intact = len(value) == length and zlib.crc32(value) == crc
    if not intact:
        raise CorruptStoreError(files.val_path, off, "value record fails its CRC check")


def _check_owner(files: DataFiles, head: bytes, key: bytes, off: int) -> None:
    """A keyed record must name ``key``: a damaged KEY offset may lead to another key's."""
    if files.keyed and head[8:] != key:
        raise CorruptStoreError(
            files.val_path,
            off,
            f"the value record there belongs to key {head[8:].hex()}, not to {key.hex()} "
            "(a damaged KEY record?); python -m kvstore verify lists the damage",
        )


def _record_length(files: DataFiles, head: bytes, off: int) -> int:
    """The value length a record header states; raises if there is no value record."""
    hsize = files.record_header_size
    if len(head) < hsize:
        raise CorruptStoreError(files.val_path, off, "value record is past the end of the file")
    length, _ = fmt.VAL_HEADER.unpack_from(head)
    if files.keyed and length == fmt.DELETED:
        raise CorruptStoreError(
            files.val_path, off, "the record there is a deletion, not a value"
        )
    return int(length)
