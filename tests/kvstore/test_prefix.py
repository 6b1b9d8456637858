"""``Store.get_prefix(key, n)``: the start of a value in one read, checked to be the key's own.

Offsets and sizes of damaged records come from docs/FORMAT.md, never from the store.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plain_format import write_plain_store

import kvstore
from kvstore import _reader
from kvstore.exceptions import CorruptStoreError, InvalidKeyError

HEADER = 24
KREC = 24
RHDR = 24  # a keyed VAL record's header: u32 length, u32 CRC, the key


def k(i: int) -> bytes:
    return kvstore.md5_key(str(i))


values = st.binary(max_size=3000)
sizes = st.integers(min_value=0, max_value=4000)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(values, sizes), min_size=1, max_size=20))
def test_a_prefix_is_the_value_cut_at_n(tmp_path: Path, items: list[tuple[bytes, int]]) -> None:
    path = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    with kvstore.open(path) as db:
        for i, (value, _) in enumerate(items):
            db[k(i)] = value
        for flushed in (False, True):  # in the write buffer, then in the file
            for i, (value, n) in enumerate(items):
                assert db.get_prefix(k(i), n) == db[k(i)][:n] == value[:n], flushed
            db.flush()
    with kvstore.open(path, readonly=True) as ro:
        for i, (value, n) in enumerate(items):
            assert ro.get_prefix(k(i), n) == value[:n]


def test_an_overwritten_value_reads_as_its_last(store: kvstore.Store) -> None:
    store[k(1)] = b"old value"
    store.flush()
    store[k(1)] = b"new"
    assert store.get_prefix(k(1), 2) == b"ne" and store.get_prefix(k(1), 100) == b"new"


def test_one_read_of_about_n_bytes(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with kvstore.open(store_path) as db:
        db[k(1)] = b"x" * 100_000
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, off: int) -> bytes:
        reads.append(n)
        return real(fd, n, off)

    monkeypatch.setattr(_reader.os, "pread", counting)
    with kvstore.open(store_path, readonly=True) as ro:
        reads.clear()  # the open's own reads
        assert ro.get_prefix(k(1), 4096) == b"x" * 4096
        assert reads == [RHDR + 4096]


def test_a_missing_or_deleted_key_raises_keyerror(store: kvstore.Store) -> None:
    store[k(1)] = b"one"
    del store[k(1)]
    for key in (k(1), k(2)):
        with pytest.raises(KeyError):
            store.get_prefix(key, 10)
    store.flush()
    with pytest.raises(KeyError):
        store.get_prefix(k(1), 10)


def test_a_bad_key_or_size_is_refused(store: kvstore.Store) -> None:
    with pytest.raises(InvalidKeyError):
        store.get_prefix(b"short", 10)
    store[k(1)] = b"one"
    with pytest.raises(ValueError, match="n must be"):
        store.get_prefix(k(1), -1)


def _keyed_store(path: Path, n: int = 50, size: int = 200) -> None:
    with kvstore.open(path) as db:
        for i in range(n):
            db[k(i)] = bytes([i]) * size
    for idx in path.glob("*.idx"):
        idx.unlink()  # the next open rebuilds the index from the (damaged) KEY file


def test_an_offset_on_another_keys_record_raises_as_get_does(store_path: Path) -> None:
    size = 200
    _keyed_store(store_path, size=size)
    (key_file,) = store_path.glob("data-*.key")
    data = bytearray(key_file.read_bytes())
    struct.pack_into("<q", data, HEADER + 10 * KREC + 16, HEADER + 11 * (RHDR + size))
    key_file.write_bytes(bytes(data))
    with kvstore.open(store_path, readonly=True, tail_check_bytes=RHDR + size) as ro:
        with pytest.raises(CorruptStoreError, match=k(11).hex()):
            ro[k(10)]
        for n in (0, 8, size, size + 100):  # whether or not the read covers the value
            with pytest.raises(CorruptStoreError, match=k(11).hex()):
                ro.get_prefix(k(10), n)
        assert ro.get_prefix(k(11), 8) == bytes([11]) * 8


def test_the_crc_is_checked_only_when_n_covers_the_value(store_path: Path) -> None:
    size = 200
    _keyed_store(store_path, size=size)
    (val_file,) = store_path.glob("data-*.val")
    data = bytearray(val_file.read_bytes())
    data[HEADER + 10 * (RHDR + size) + RHDR + size - 1] ^= 0xFF  # the value's last byte
    val_file.write_bytes(bytes(data))
    with kvstore.open(store_path, readonly=True, tail_check_bytes=RHDR + size) as ro:
        assert ro.get_prefix(k(10), size - 1) == bytes([10]) * (size - 1)  # damage not seen
        for n in (size, size + 1):
            with pytest.raises(CorruptStoreError, match="CRC"):
                ro.get_prefix(k(10), n)
        with pytest.raises(CorruptStoreError, match="CRC"):
            ro[k(10)]


def test_a_format_2_store_reads_as_get_does(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    model = write_plain_store(path, [(k(1), b"one value"), (k(2), b"two"), (k(1), b"first!"),
                                     (k(3), b"gone"), (k(3), None), (k(4), b"last")])
    with kvstore.open(path, readonly=True) as ro:
        for key, value in model.items():
            for n in (0, 2, len(value), 100):
                assert ro.get_prefix(key, n) == value[:n]
        with pytest.raises(KeyError):
            ro.get_prefix(k(3), 5)
    (val_file,) = path.glob("data-*.val")
    data = bytearray(val_file.read_bytes())
    two = HEADER + (8 + len(b"one value")) + 8  # k(2)'s value (a plain record's header: 8)
    assert data[two : two + 3] == b"two"
    data[two + 2] ^= 0xFF
    val_file.write_bytes(bytes(data))
    with kvstore.open(path, readonly=True, tail_check_bytes=0) as ro:
        assert ro.recovery is None
        assert ro.get_prefix(k(2), 2) == b"tw"
        for n in (3, 10):
            with pytest.raises(CorruptStoreError, match="CRC"):
                ro.get_prefix(k(2), n)


def test_a_huge_n_reads_no_more_than_the_value(store_path: Path) -> None:
    with kvstore.open(store_path) as db:
        db[k(1)] = b"small"
    with kvstore.open(store_path, readonly=True) as ro:  # pread would allocate n bytes first
        assert ro.get_prefix(k(1), 1 << 40) == b"small"
