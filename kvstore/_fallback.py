"""The pure-Python hot paths: the reference that ``_speedups.c`` mirrors, and the fallback.

Every class here has a twin of the same name, fields and methods in the C
extension (see ``_backend`` for which one is active and why the split is
where it is). The C twin must give the same results, raise the same
exceptions and leave the same bytes in the segment arrays and files; where it
would need anything beyond a plain fast path (a key to normalize, a closed
store, a value to read with pread, a CRC failure), it calls the Python code
that this module (``check_key``) or the owning class defines, so the unusual
paths exist only once. The index's walks are in ``_fallback_index`` (re-exported
here with the table's constants, so this module names every twin).

The classes are *bases*: ``HashIndex``, ``Store``, ``KeySet`` and ``KeyIntMap``
inherit their hot paths from one of them and add everything else in Python.
Their ``__slots__`` are the fields the C types keep in their structs.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _format as fmt
from ._fallback_index import (
    KEY_SIZE,
    MAX_LOAD,
    MIN_LOAD,
    MIN_SEGMENT_CAPACITY,
    MULT64,
    MULT128,
    NUM_SEGMENTS,
    REMAP_SLACK,
    SMALL_BATCH,
    IndexBase,
    SegmentBase,
    decode_values,
    group_by_segment,
)
from .exceptions import InvalidKeyError

__all__ = [
    "KEY_SIZE",
    "MAX_LOAD",
    "MIN_LOAD",
    "MIN_SEGMENT_CAPACITY",
    "MULT64",
    "MULT128",
    "NUM_SEGMENTS",
    "REMAP_SLACK",
    "SMALL_BATCH",
    "IndexBase",
    "KeyIntMapBase",
    "KeySetBase",
    "Lock",
    "SegmentBase",
    "StoreBase",
    "check_key",
    "check_keyed_records",
    "check_val_records",
    "decode_values",
    "group_by_segment",
]

_OFF = struct.Struct("<q")
_TOMB = _OFF.pack(-1)
_CHECK_BATCH = 256  # VAL records check_val_records turns into Python ints at a time


# The owners' lock. Its C twin is a mutex that behaves the same and that the C write
# paths take without a method call (a threading.Lock's acquire parses its arguments
# and reads the clock: ~0.1 us of a put).
Lock = threading.Lock


def check_key(key: Any) -> bytes:
    """The key as bytes, or InvalidKeyError; the slow path of every single-key method."""
    if isinstance(key, bytearray | memoryview):
        key = bytes(key)
    if not isinstance(key, bytes):
        raise InvalidKeyError(f"keys are 16 bytes, got {type(key).__name__}; use kvstore.md5_key()")
    if len(key) != KEY_SIZE:
        raise InvalidKeyError(f"keys are 16 bytes, got {len(key)}; use kvstore.md5_key()")
    return key


class StoreBase:
    """``Store``'s single-key paths. The owner provides ``_live()``, ``_writable()``,
    ``_check_value(value)``, ``_read(g, off, key)`` and ``_flush_locked(g)``.

    A generation ``g`` says its VAL layout in ``g.keyed`` (see ``_format``): a keyed
    record carries its key and a CRC over length, key and value, and a delete appends
    one too; a plain (format 1, 2) record carries a CRC of the value only."""

    __slots__ = ("_g", "_lock", "readonly", "max_value_size", "_buffer_size")
    _g: Any
    _lock: Any
    readonly: bool
    max_value_size: int
    _buffer_size: int

    if TYPE_CHECKING:

        def _live(self) -> Any: ...

        def _writable(self) -> Any: ...

        def _check_value(self, value: Any) -> bytes: ...

        def _read(self, g: Any, off: int, key: bytes) -> bytes: ...

        def _flush_locked(self, g: Any) -> None: ...

    def __contains__(self, key: object) -> bool:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        g = self._g
        if g is None:
            g = self._live()  # raises StoreClosedError
        return key in g.index

    def _check_values(self, values: list[Any]) -> list[bytes]:
        """Every value as a put checks it (raising on the first bad one). Thread-safe."""
        limit = self.max_value_size
        return [
            v if type(v) is bytes and len(v) <= limit else self._check_value(v) for v in values
        ]

    def _pack_values(self, keys: np.ndarray, values: list[bytes], rel: np.ndarray,
                     keyed: bool) -> bytes:
        """``put_many``'s VAL records for ``keys`` ((n, 16) uint8), keyed or plain, back
        to back, each value checked as a put checks it; ``rel[j]`` = where record j
        starts. Thread-safe (touches no store state)."""
        vals = [
            v if type(v) is bytes and len(v) <= self.max_value_size else self._check_value(v)
            for v in values
        ]
        if len(keys) != len(vals):
            raise ValueError("_pack_values: keys and values differ in length")
        data, starts = fmt.keyed_records(keys, vals) if keyed else fmt.val_records(vals)
        rel[:] = starts
        return data

    def __getitem__(self, key: bytes) -> bytes:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        g = self._g
        if g is None:
            g = self._live()
        off = g.index.get(key)
        if off < 0:
            raise KeyError(key)
        return self._read(g, off, key)

    def get(self, key: bytes, default: Any = None) -> Any:
        """The value, or ``default`` if absent. Lock-free."""
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        g = self._g
        if g is None:
            g = self._live()
        off = g.index.get(key)
        if off < 0:
            return default
        return self._read(g, off, key)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        if type(value) is not bytes or len(value) > self.max_value_size:
            value = self._check_value(value)
        g = self._g
        keyed = g is None or g.keyed  # the CRC is computed before the lock is taken
        header = _record_header(key, value, keyed)
        with self._lock:
            g = self._g
            if g is None or self.readonly:
                g = self._writable()
            if g.keyed is not keyed:  # a compaction rewrote the generation meanwhile
                header = _record_header(key, value, g.keyed)
            base, buf = g.wbuf
            off = base + len(buf)
            buf += header
            buf += value
            g.kbuf += key
            g.kbuf += _OFF.pack(off)
            g.index.set(key, off)  # publish only once the bytes are readable
            if len(buf) + len(g.kbuf) >= self._buffer_size:
                self._flush_locked(g)

    def __delitem__(self, key: bytes) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        with self._lock:
            g = self._writable()
            if g.index.delete(key) < 0:
                raise KeyError(key)
            buffered = 0
            if g.keyed:  # the delete leaves its record in VAL too
                buf = g.wbuf[1]
                buf += fmt.pack_deletion(key)
                buffered = len(buf)
            g.kbuf += key
            g.kbuf += _TOMB
            if buffered + len(g.kbuf) >= self._buffer_size:
                self._flush_locked(g)


def _record_header(key: bytes, value: bytes, keyed: bool) -> bytes:
    """What precedes ``value`` in its VAL record."""
    if keyed:
        return fmt.pack_keyed_header(key, value)
    return fmt.VAL_HEADER.pack(len(value), zlib.crc32(value))


class KeySetBase:
    """``KeySet``'s single-key paths; the owner sets ``_index`` and ``_lock``."""

    __slots__ = ("_index", "_lock")
    _index: Any
    _lock: Any

    def __contains__(self, key: object) -> bool:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        return key in self._index

    def add(self, key: bytes) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        with self._lock:
            self._index.set(key, 0)

    def discard(self, key: bytes) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        with self._lock:
            self._index.delete(key)


class KeyIntMapBase:
    """``KeyIntMap``'s single-key paths; the owner sets ``_index`` and ``_lock`` and
    provides ``_check_value(value)``."""

    __slots__ = ("_index", "_lock")
    _index: Any
    _lock: Any

    if TYPE_CHECKING:

        def _check_value(self, value: Any) -> int: ...

    def __contains__(self, key: object) -> bool:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        return key in self._index

    def __getitem__(self, key: bytes) -> int:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        value: int = self._index.get(key)
        if value < 0:
            raise KeyError(key)
        return value

    def get(self, key: bytes, default: Any = None) -> Any:
        """The value, or ``default`` if absent. Lock-free."""
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        value = self._index.get(key)
        return default if value < 0 else value

    def __setitem__(self, key: bytes, value: int) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        value = self._check_value(value)
        with self._lock:
            self._index.set(key, value)

    def __delitem__(self, key: bytes) -> None:
        if type(key) is not bytes or len(key) != KEY_SIZE:
            key = check_key(key)
        with self._lock:
            if self._index.delete(key) < 0:
                raise KeyError(key)


def check_keyed_records(buf: Any, records: Any, size: int, pos: int) -> tuple[int, int]:
    """``_format.check_keyed_record`` for the KEY records ``records`` (a buffer of whole
    24-byte records, in file order), the first standing for the keyed VAL record at
    ``pos`` of a VAL file whose first ``size`` bytes are ``buf``, each next one for the
    record after: (how many pass before the first that fails, where the last that
    passed ends, or ``pos``). The caller asks check_keyed_record why one fails."""
    if not 0 <= size <= len(buf):
        raise ValueError("check_keyed_records: size is outside the buffer")
    raw = memoryview(records).cast("B")
    if len(raw) % fmt.KEY_RECORD_SIZE:
        raise ValueError("check_keyed_records: records are not whole KEY records")
    passed = 0
    for i in range(0, len(raw), fmt.KEY_RECORD_SIZE):
        key = bytes(raw[i : i + KEY_SIZE])
        (off,) = _OFF.unpack_from(raw, i + KEY_SIZE)
        problem, end = fmt.check_keyed_record(buf, pos, size, key, off)
        if problem is not None:
            break
        pos = end
        passed += 1
    return passed, pos


def check_val_records(buf: Any, offs: np.ndarray, size: int, prev_end: int) -> tuple[int, int]:
    """``_format.check_val_record`` for the value records at ``offs`` (int64, in file
    order) of a VAL file whose first ``size`` bytes are ``buf``, each against the end of
    the one before: (how many pass before the first that fails, where the last that
    passed ends, or ``prev_end``). The caller asks check_val_record why one fails."""
    if not 0 <= size <= len(buf):
        raise ValueError("check_val_records: size is outside the buffer")
    passed = 0
    for b in range(0, len(offs), _CHECK_BATCH):  # Python ints for a batch only
        for off in offs[b : b + _CHECK_BATCH].tolist():
            problem, end = fmt.check_val_record(buf, off, size, prev_end)
            if problem is not None:
                return passed, prev_end
            prev_end = end
            passed += 1
    return passed, prev_end
