"""``kvstore.VersionReader``: values read by ``versions()``'s versions, with no index in
memory: each value checked to be its key's own, older versions still readable, and reads
that survive a compaction that came after the open.

Offsets of damaged bytes come from docs/FORMAT.md, never from the store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plain_format import write_plain_store

import kvstore
from kvstore.exceptions import CorruptStoreError, InvalidKeyError, StoreNotFoundError

RHDR = 24  # a keyed VAL record's header: u32 length, u32 CRC, the key (FORMAT.md)


def k(i: int) -> bytes:
    return kvstore.md5_key(str(i))


def snapshot(path: Path) -> tuple[int, dict[bytes, int]]:
    with kvstore.open(path, readonly=True) as ro:
        gen, keys, vers = ro.versions()
    return gen, {bytes(key): int(v) for key, v in zip(keys, vers, strict=True)}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(st.tuples(st.integers(0, 9), st.binary(max_size=9000)),
                       min_size=1, max_size=30))
def test_every_version_reads_as_the_value_written_then(
        tmp_path: Path, writes: list[tuple[int, bytes]]) -> None:
    path = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    seen: list[tuple[bytes, int, bytes]] = []  # (key, version, value) of every write
    with kvstore.open(path) as db:
        for i, value in writes:
            db[k(i)] = value
            db.flush()  # on disk: the version a snapshot of the files gives
            seen.append((k(i), int(db.versions_of([k(i)])[1][0]), value))
        db.flush()
    gen, live = snapshot(path)
    with kvstore.VersionReader(path, gen) as reader, kvstore.open(path, readonly=True) as ro:
        for key, ver, value in seen:  # older versions too: records are never moved
            assert reader.get(key, ver) == value
        for key, ver in live.items():
            assert reader.get(key, ver) == ro[key]


def test_a_version_of_another_key_or_damaged_is_refused(store_path: Path) -> None:
    with kvstore.open(store_path) as db:
        db[k(1)] = b"one" * 100
        db[k(2)] = b"two" * 100
    gen, live = snapshot(store_path)
    with kvstore.VersionReader(store_path, gen) as reader:
        with pytest.raises(CorruptStoreError, match="belongs to key"):
            reader.get(k(1), live[k(2)])  # a record there, CRC-valid, not k(1)'s
        with pytest.raises(KeyError):
            reader.get(k(3), -1)  # versions_of's answer for an absent key
        with pytest.raises(InvalidKeyError):
            reader.get(b"short", live[k(1)])
        with pytest.raises(CorruptStoreError, match="past the end"):
            reader.get(k(1), 10**9)
    val = store_path / f"data-{gen:06d}.val"
    data = bytearray(val.read_bytes())
    data[live[k(1)] + RHDR + 5] ^= 0xFF  # a byte of k(1)'s value
    val.write_bytes(bytes(data))
    with kvstore.VersionReader(store_path, gen) as reader:
        with pytest.raises(CorruptStoreError, match="CRC"):
            reader.get(k(1), live[k(1)])
        assert reader.get(k(2), live[k(2)]) == b"two" * 100


def test_reads_go_on_across_a_compaction_after_the_open(store_path: Path) -> None:
    with kvstore.open(store_path) as db:
        for i in range(200):
            db[k(i)] = str(i).encode() * 50
    gen, live = snapshot(store_path)
    reader = kvstore.VersionReader(store_path, gen)
    try:
        with kvstore.open(store_path) as db:
            db[k(0)] = b"written after the snapshot"
            db.compact()  # a new generation; the old files are removed
        assert not (store_path / f"data-{gen:06d}.val").exists()
        for i in range(200):
            assert reader.get(k(i), live[k(i)]) == str(i).encode() * 50
    finally:
        reader.close()
    with pytest.raises(StoreNotFoundError, match=f"no generation {gen}"):
        kvstore.VersionReader(store_path, gen)


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_format_reads_its_values_though_records_name_no_key(
        store_path: Path, version: int) -> None:
    """Formats 1 and 2 (FORMAT.md) keep no key in a VAL record: a value is read and
    CRC-checked at its version, as a get reads it there."""
    store_path.mkdir()
    write_plain_store(store_path, [(k(1), b"one"), (k(2), b"two" * 2000), (k(1), b"uno")],
                      version=version)
    gen, live = snapshot(store_path)
    with kvstore.VersionReader(store_path, gen) as reader:
        assert reader.get(k(1), live[k(1)]) == b"uno"
        assert reader.get(k(2), live[k(2)]) == b"two" * 2000
