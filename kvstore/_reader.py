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
    from ._open import _Generation



def read_value(g: _Generation, off: int, key: bytes) -> bytes:
    """The value of ``key``'s record at VAL offset ``off`` of generation ``g``. Lock-free."""
    base, buf = g.wbuf
    files = g.files
    hsize = fmt.RECORD_HEADER_SIZE if g.keyed else fmt.VAL_HEADER_SIZE
    if off >= base:
        rel = off - base
        head = bytes(buf[rel : rel + hsize])
        length = _record_length(g, head, off)
        value = bytes(buf[rel + hsize : rel + hsize + length])
    else:
        mm, mlen = files.mm
        if base - mlen > REMAP_SLACK:
            mm, mlen = files.remap(base)
        if off + hsize <= mlen and mm is not None:
            head = mm[off : off + hsize]
            length = _record_length(g, head, off)
            end = off + hsize + length
            if end <= mlen:
                value = mm[off + hsize : end]
            else:
                value = os.pread(files.val_fd, length, off + hsize)
        else:
            head = os.pread(files.val_fd, hsize + 4096, off)
            length = _record_length(g, head, off)
            value = head[hsize : hsize + length]
            if len(value) < length:
                value += os.pread(files.val_fd, length - len(value), off + hsize + len(value))
            head = head[:hsize]
    _, crc = fmt.VAL_HEADER.unpack_from(head)
    if g.keyed:
        intact = len(value) == length and fmt.keyed_crc(length, head[8:], value) == crc
    else:
        intact = len(value) == length and zlib.crc32(value) == crc
    if not intact:
        raise CorruptStoreError(files.val_path, off, "value record fails its CRC check")
    if g.keyed and head[8:] != key:
        raise CorruptStoreError(
            files.val_path,
            off,
            f"the value record there belongs to key {head[8:].hex()}, not to {key.hex()} "
            "(a damaged KEY record?); python -m kvstore verify lists the damage",
        )
    return value


def _record_length(g: _Generation, head: bytes, off: int) -> int:
    """The value length a record header states; raises if there is no value record."""
    hsize = fmt.RECORD_HEADER_SIZE if g.keyed else fmt.VAL_HEADER_SIZE
    if len(head) < hsize:
        raise CorruptStoreError(g.files.val_path, off, "value record is past the end of the file")
    length, _ = fmt.VAL_HEADER.unpack_from(head)
    if g.keyed and length == fmt.DELETED:
        raise CorruptStoreError(
            g.files.val_path, off, "the record there is a deletion, not a value"
        )
    return int(length)
