"""Byte layouts of the KEY and VAL files: pack, unpack, check. No I/O here.

Theory of operation
-------------------
A store is a directory holding one *generation* of two files:

* ``data-<gen>.key``: a 24-byte header, then fixed 24-byte records:
  16-byte key, int64 little-endian offset of the value record in the VAL
  file (-1 = tombstone). The last record for a key wins.
* ``data-<gen>.val``: a 24-byte header, then one record per KEY record, in the
  same order (format 3, *keyed*): u32 LE length (``DELETED``: a deletion, no
  value), u32 LE CRC32 of the length field, key and value, the 16-byte key, the
  value bytes. A record names its key, so a get can tell that the record it read
  is its key's own, and VAL alone says everything KEY does. Formats 1 and 2
  (*plain*) have u32 length, u32 CRC32 of the value, the value, and nothing for
  deletions; kvstore still reads and appends to them (compaction rewrites them
  as format 3).

Both headers are: 8-byte magic, u32 LE format version, u32 LE header
checksum, u64 LE generation. The checksum (version 2 on) is the CRC32 of the
other 20 header bytes, so a flipped bit reads as a damaged header rather than
as a newer version; version 1 files have 0 there and no checksum. The
generation ties a KEY file to its VAL file: a pair whose generations or
versions differ is refused.

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

FORMAT_VERSION = 3  # what new files are written as, and the newest this reads
KEYED_VERSION = 3  # from here on a VAL record names its key, and a delete leaves one
LEGACY_VERSION = 1  # no header checksum: bytes 12..15 are 0
KEY_SIZE = 16
HEADER_SIZE = 24
KEY_RECORD_SIZE = 24
LENGTH_SIZE = 4  # every VAL record, either layout, starts with its u32 length
VAL_HEADER_SIZE = 8  # a plain (format 1, 2) VAL record's header: u32 length + u32 crc32
RECORD_HEADER_SIZE = 24  # a keyed (format 3) VAL record's: u32 length, u32 crc32, key
DELETED = 0xFFFF_FFFF  # a keyed record's length field for a deletion (no value follows)
TOMBSTONE = -1
KEY_MAGIC = b"KVSTKEY\n"
VAL_MAGIC = b"KVSTVAL\n"
# A VAL record's length is a u32, and its largest value marks a deletion.
MAX_VALUE_SIZE_LIMIT = DELETED - 1

_HEADER = struct.Struct("<8sIIQ")
# The first 8 bytes of every VAL record, either layout: u32 length, u32 CRC32.
VAL_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<I")
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


def unpack_header_version(data: bytes, magic: bytes, path: str) -> tuple[int, int]:
    """Check a file header; return (generation, format version) or raise a clear error.

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
        return int(generation), LEGACY_VERSION
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
    return int(generation), int(version)


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
    length, crc = VAL_HEADER.unpack_from(buf, off)
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


def unpack_val_header(
    data: bytes | bytearray | memoryview | mmap.mmap, pos: int = 0
) -> tuple[int, int]:
    """Return (length, crc32) of the value record header at ``pos``."""
    length, crc = VAL_HEADER.unpack_from(data, pos)
    return length, crc


def pack_key_record(key: bytes, offset: int) -> bytes:
    return key + _OFFSET.pack(offset)


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


# -- keyed VAL records (format 3) ------------------------------------------------


def keyed_crc(length_field: int, key: bytes | memoryview, value: bytes | memoryview = b"") -> int:
    """The CRC of a keyed record: over its length field, key and value (not itself)."""
    return zlib.crc32(value, zlib.crc32(key, zlib.crc32(_LENGTH.pack(length_field))))


def pack_keyed_header(key: bytes, value: bytes) -> bytes:
    """The 24 bytes before ``value`` in its keyed record."""
    n = len(value)
    return VAL_HEADER.pack(n, keyed_crc(n, key, value)) + key


def pack_deletion(key: bytes) -> bytes:
    """The keyed record a delete leaves in VAL."""
    return VAL_HEADER.pack(DELETED, keyed_crc(DELETED, key)) + key


def keyed_records(keys: np.ndarray, values: list[bytes]) -> tuple[bytes, np.ndarray]:
    """``val_records`` for keyed records: ``keys`` is (n, 16) uint8, row j the key of
    ``values[j]``; returns the records back to back and where each starts."""
    n = len(values)
    kb = np.ascontiguousarray(keys, dtype=np.uint8).tobytes()
    parts: list[bytes] = [b""] * (2 * n)
    for j, value in enumerate(values):
        key = kb[j * KEY_SIZE : (j + 1) * KEY_SIZE]
        parts[2 * j] = pack_keyed_header(key, value)
        parts[2 * j + 1] = value
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    rel = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lengths[:-1] + RECORD_HEADER_SIZE, out=rel[1:])
    return b"".join(parts), rel


def check_keyed_record(
    buf: bytes | bytearray | memoryview | mmap.mmap, pos: int, size: int, key: bytes, off: int
) -> tuple[str | None, int]:
    """Check that the keyed record at ``pos`` of a VAL file whose first ``size`` bytes
    are ``buf`` is the one the KEY record (``key``, ``off``) stands for: intact, of the
    same kind (``off`` is ``TOMBSTONE`` for a delete), with the same key, and for a put
    at ``off``.

    Returns (what is wrong or None, the record's end). KEY record i stands for VAL
    record i, so ``pos`` is where the record before ended. The CRC is computed in
    bounded pieces, so a damaged length field costs time, not memory.
    """
    if pos < HEADER_SIZE or pos + RECORD_HEADER_SIZE > size:
        return "offset outside the VAL file", 0
    length, crc = VAL_HEADER.unpack_from(buf, pos)
    deleted = length == DELETED
    end = pos + RECORD_HEADER_SIZE + (0 if deleted else length)
    if end > size:
        return f"value length {length} runs past the end of the VAL file", 0
    got = zlib.crc32(buf[pos + 8 : pos + RECORD_HEADER_SIZE], zlib.crc32(buf[pos : pos + 4]))
    for start in range(pos + RECORD_HEADER_SIZE, end, _CRC_PIECE):
        got = zlib.crc32(buf[start : min(end, start + _CRC_PIECE)], got)
    if got != crc:
        return "CRC mismatch", 0
    if deleted != (off == TOMBSTONE):
        what = "a deletion" if deleted else "a value"
        return f"the VAL record is {what}, the KEY record says otherwise", 0
    owner = bytes(buf[pos + 8 : pos + RECORD_HEADER_SIZE])
    if owner != key:
        return f"the VAL record belongs to key {owner.hex()}", 0
    if off != TOMBSTONE and off != pos:
        return f"offset {off} is not where its VAL record lies ({pos})", 0
    return None, end


def keyed_record_end(buf: bytes | bytearray | memoryview | mmap.mmap, pos: int) -> int:
    """Where the (unchecked) keyed record at ``pos`` ends, by its length field."""
    (length,) = _LENGTH.unpack_from(buf, pos)
    return pos + RECORD_HEADER_SIZE + (0 if length == DELETED else length)


def record_lengths(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The length fields (int64) of the VAL records at ``starts`` in ``data``, a VAL
    file's bytes as a uint8 array (either layout: the length comes first)."""
    out = np.zeros(len(starts), dtype=np.int64)
    for b in range(LENGTH_SIZE):
        out |= data[starts + b].astype(np.int64) << (8 * b)
    return out


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
