"""Stores of formats 1 and 2 (plain VAL records), laid out by hand from docs/FORMAT.md.

kvstore writes only format 3 (keyed records), but must keep reading and appending to
the stores older releases wrote. These writers are independent of kvstore's code, so
the tests that use them check kvstore against the format, not against itself.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def header(magic: bytes, gen: int, version: int) -> bytes:
    """A file header: version 1 has 0 where version 2 has the header checksum."""
    head, tail = struct.pack("<8sI", magic, version), struct.pack("<Q", gen)
    checksum = 0 if version == 1 else zlib.crc32(tail, zlib.crc32(head))
    return head + struct.pack("<I", checksum) + tail


def plain_record(value: bytes) -> bytes:
    """A format 1/2 VAL record: u32 length, u32 CRC32 of the value, the value."""
    return struct.pack("<II", len(value), zlib.crc32(value)) + value


def write_plain_store(
    path: Path, ops: list[tuple[bytes, bytes | None]], *, version: int = 2, gen: int = 1
) -> dict[bytes, bytes]:
    """Write ``ops`` (key, value; None deletes) as a format ``version`` store in the
    directory ``path``; return what it holds. A delete leaves only its KEY record."""
    path.mkdir(parents=True, exist_ok=True)
    keys = bytearray(header(b"KVSTKEY\n", gen, version))
    vals = bytearray(header(b"KVSTVAL\n", gen, version))
    model: dict[bytes, bytes] = {}
    for key, value in ops:
        if value is None:
            keys += key + struct.pack("<q", -1)
            model.pop(key, None)
        else:
            keys += key + struct.pack("<q", len(vals))
            vals += plain_record(value)
            model[key] = value
    (path / f"data-{gen:06d}.key").write_bytes(bytes(keys))
    (path / f"data-{gen:06d}.val").write_bytes(bytes(vals))
    return model
