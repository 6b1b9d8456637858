"""Byte layouts of the KEY and VAL files: pack, unpack, check. No I/O here.

Theory of operation
-------------------
A store is a directory holding one *generation* of two files:

* ``data-<gen>.key``: a 24-byte header, then fixed 24-byte records:
  16-byte key, int64 little-endian offset of the value record in the VAL
  file (-1 = tombstone). The last record for a key wins.
* ``data-<gen>.val``: a 24-byte header, then value records:
  u32 LE length, u32 LE CRC32 of the value, the value bytes.

Both headers are: 8-byte magic, u32 LE format version, u32 LE header
checksum, u64 LE generation. The checksum (version 2) is the CRC32 of the
other 20 header bytes, so a flipped bit reads as a damaged header rather than
as a newer version; version 1 files have 0 there and no checksum. The
generation ties a KEY file to its VAL file: a pair whose generations differ is
refused.

Values are appended before the KEY records that point at them, and every
writer appends at the end, so the offsets of successive put records strictly
increase. Recovery relies on that: the records that a torn write can damage
are always a suffix of the KEY file. See docs/FORMAT.md.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
import zlib

import numpy as np

from .exceptions import CorruptStoreError, UnsupportedVersionError

FORMAT_VERSION = 2  # what new files are written as, and the newest this reads
LEGACY_VERSION = 1  # no header checksum: bytes 12..15 are 0
KEY_SIZE = 16
HEADER_SIZE = 24
KEY_RECORD_SIZE = 24
VAL_HEADER_SIZE = 8  # u32 length + u32 crc32
TOMBSTONE = -1
KEY_MAGIC = b"KVSTKEY\n"
VAL_MAGIC = b"KVSTVAL\n"
# A VAL record's length is a u32; larger values cannot be represented.
MAX_VALUE_SIZE_LIMIT = 0xFFFF_FFFF

_HEADER = struct.Struct("<8sIIQ")
_VAL_HEADER = struct.Struct("<II")
_OFFSET = struct.Struct("<q")
_CRC_PIECE = 1 << 20  # bytes of one value CRC-checked per step

# One KEY record as numpy sees it: KEY files are read in chunks of these.
KEY_RECORD_DTYPE = np.dtype([("key", "V16"), ("off", "<i8")])
assert KEY_RECORD_DTYPE.itemsize == KEY_RECORD_SIZE


def md5_key(data: bytes | bytearray | memoryview | str) -> bytes:
    """Return the 16-byte md5 digest of ``data`` (a str is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.md5(data).digest()


def header_checksum(data: bytes) -> int:
    """CRC32 of a header's bytes 0..11 and 16..23: everything but the checksum field."""
    return zlib.crc32(data[16:HEADER_SIZE], zlib.crc32(data[:12]))


def pack_header(magic: bytes, generation: int) -> bytes:
    """A current-version header (with its checksum)."""
    head = _HEADER.pack(magic, FORMAT_VERSION, 0, generation)
    return _HEADER.pack(magic, FORMAT_VERSION, header_checksum(head), generation)


def unpack_header(data: bytes, magic: bytes, path: str) -> int:
    """Check a file header; return its generation or raise a clear error.

    The checksum is checked before the version is believed: a damaged header
    must not pass for a newer format.
    """
    which = "KEY" if magic == KEY_MAGIC else "VAL"
    if len(data) < HEADER_SIZE:
        raise CorruptStoreError(
            path, 0, f"file header is {len(data)} bytes, expected {HEADER_SIZE}"
        )
    got_magic, version, checksum, generation = _HEADER.unpack_from(data)
    if got_magic != magic:
        # A kvstore header whose only fault is its magic still matches its checksum
        # once the right magic is put back: that is damage, not a foreign file.
        repaired = magic + data[8:HEADER_SIZE]
        if version != LEGACY_VERSION and header_checksum(repaired) == checksum:
            raise CorruptStoreError(path, 0, _damaged(which, f"bad magic {got_magic!r}"))
        raise CorruptStoreError(
            path, 0, f"bad magic {got_magic!r}, expected {magic!r}: not a kvstore file"
        )
    if version == LEGACY_VERSION and checksum == 0:
        return int(generation)
    computed = header_checksum(data)
    if computed != checksum:
        detail = f"checksum {checksum:#010x} does not match its bytes ({computed:#010x})"
        raise CorruptStoreError(path, 0, _damaged(which, detail))
    if version > FORMAT_VERSION:
        raise UnsupportedVersionError(
            path,
            8,
            f"format version {version} is newer than this kvstore reads "
            f"({FORMAT_VERSION}); upgrade kvstore",
        )
    if version < 2:  # 0, or a version 1 header with a checksum: no writer makes either
        raise CorruptStoreError(path, 8, f"invalid format version {version}")
    return int(generation)


def _damaged(which: str, detail: str) -> str:
    return (
        f"damaged header in the {which} file ({detail}); the header cannot be trusted, so "
        "restore the store from a backup or load it from an earlier dump "
        "(python -m kvstore dump / load)"
    )


def check_val_record(
    buf: bytes | bytearray | memoryview | mmap.mmap, off: int, size: int, prev_end: int
) -> tuple[str | None, int]:
    """Check the value record at ``off`` of a VAL file whose first ``size`` bytes are ``buf``.

    Returns (what is wrong or None, the record's end). ``prev_end`` is where the
    previous sound record ended: puts are appended, so a record starting
    before it is unsound. The CRC is computed in bounded pieces, so a damaged
    length field costs time, not memory.
    """
    if off < HEADER_SIZE or off + VAL_HEADER_SIZE > size:
        return "offset outside the VAL file", 0
    length, crc = _VAL_HEADER.unpack_from(buf, off)
    start = off + VAL_HEADER_SIZE
    end = start + length
    if end > size:
        return f"value length {length} runs past the end of the VAL file", 0
    if length <= _CRC_PIECE:
        got = zlib.crc32(buf[start:end])
    else:
        got = 0
        for pos in range(start, end, _CRC_PIECE):
            got = zlib.crc32(buf[pos : min(end, pos + _CRC_PIECE)], got)
    if got != crc:
        return "CRC mismatch", 0
    if off < prev_end:
        return "record overlaps the previous one", 0
    return None, end


def pack_val_record(value: bytes) -> bytes:
    return _VAL_HEADER.pack(len(value), zlib.crc32(value)) + value


def pack_val_header(length: int, crc: int) -> bytes:
    return _VAL_HEADER.pack(length, crc)


def unpack_val_header(
    data: bytes | bytearray | memoryview | mmap.mmap, pos: int = 0
) -> tuple[int, int]:
    """Return (length, crc32) of the value record header at ``pos``."""
    length, crc = _VAL_HEADER.unpack_from(data, pos)
    return length, crc


def pack_key_record(key: bytes, offset: int) -> bytes:
    return key + _OFFSET.pack(offset)


def value_is_intact(value: bytes | memoryview, crc: int) -> bool:
    return zlib.crc32(value) == crc


def val_records(values: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Pack many values into one VAL byte string; return it and each record's relative offset."""
    n = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    headers = np.empty((n, 2), dtype="<u4")
    headers[:, 0] = lengths
    headers[:, 1] = np.fromiter(map(zlib.crc32, values), dtype=np.uint32, count=n)
    hdr_bytes = headers.tobytes()
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = [
        hdr_bytes[i : i + VAL_HEADER_SIZE] for i in range(0, n * VAL_HEADER_SIZE, VAL_HEADER_SIZE)
    ]
    parts[1::2] = values
    rel = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lengths[:-1] + VAL_HEADER_SIZE, out=rel[1:])
    return b"".join(parts), rel


def record_keys(records: np.ndarray) -> np.ndarray:
    """The keys of KEY records as a contiguous (n, 16) uint8 array."""
    return np.ascontiguousarray(records["key"]).view(np.uint8).reshape(-1, KEY_SIZE)


def record_key_rows(records: np.ndarray) -> np.ndarray:
    """The keys of contiguous KEY records as an (n, 16) uint8 view, rows 24 bytes
    apart: what ``HashIndex.set_many`` takes without a copy."""
    return records.view(np.uint8).reshape(-1, KEY_RECORD_SIZE)[:, :KEY_SIZE]


def key_records(keys: np.ndarray, offsets: np.ndarray) -> bytes:
    """Pack (n, 16) uint8 keys and n offsets into KEY records."""
    recs = np.empty(len(offsets), dtype=KEY_RECORD_DTYPE)
    recs["key"] = np.ascontiguousarray(keys).view("V16").reshape(-1)
    recs["off"] = offsets
    return recs.tobytes()
