"""The Store's API: mapping behaviour, batch paths, errors, on-disk layout, compaction."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random
import struct
import subprocess
import threading
import zlib
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np
import pytest
from plain_format import write_plain_store

import kvstore
from kvstore.exceptions import (
    InvalidKeyError,
    KVStoreError,
    NotAStoreError,
    ReadOnlyError,
    StoreClosedError,
    StoreNotFoundError,
    ValueTooLargeError,
)


def k(i: int | str) -> bytes:
    return kvstore.md5_key(str(i))


def v(i: int, size: int | None = None) -> bytes:
    """A value derived from i, of a length that varies with i unless given."""
    n = (i * 37) % 301 if size is None else size
    return (f"value-{i}:".encode() * (n // 8 + 1))[:n]


class TestMd5Key:
    def test_md5_key_is_the_md5_digest(self) -> None:
        assert (
            kvstore.md5_key(b"http://example.com/") == hashlib.md5(b"http://example.com/").digest()
        )

    def test_md5_key_encodes_str_as_utf8(self) -> None:
        assert kvstore.md5_key("h\u00e9") == hashlib.md5("h\u00e9".encode()).digest()

    def test_key_size_constant(self) -> None:
        assert kvstore.KEY_SIZE == 16
        assert len(kvstore.md5_key(b"")) == 16


class TestMapping:
    def test_store_is_a_mutable_mapping(self, store: kvstore.Store) -> None:
        assert isinstance(store, MutableMapping)

    def test_open_creates_missing_directory(self, tmp_path: Path) -> None:
        path = tmp_path / "a" / "b"
        with kvstore.open(path) as db:
            db[k(1)] = b"x"
        assert path.is_dir()
        with kvstore.open(path, readonly=True) as db:
            assert db[k(1)] == b"x"

    def test_put_get_overwrite(self, store: kvstore.Store) -> None:
        store[k(1)] = b"one"
        assert store[k(1)] == b"one"
        store[k(1)] = b"uno"
        assert store[k(1)] == b"uno"
        assert type(store[k(1)]) is bytes
        assert len(store) == 1

    def test_get_missing_raises_keyerror_with_the_key(self, store: kvstore.Store) -> None:
        store[k(1)] = b"one"
        with pytest.raises(KeyError) as info:
            store[k(2)]
        assert info.value.args == (k(2),)
        assert not isinstance(info.value, KVStoreError)

    def test_del_missing_raises_keyerror_with_the_key(self, store: kvstore.Store) -> None:
        with pytest.raises(KeyError) as info:
            del store[k(2)]
        assert info.value.args == (k(2),)
        store[k(2)] = b"two"
        del store[k(2)]
        with pytest.raises(KeyError):
            del store[k(2)]

    def test_delete_then_contains_and_get(self, store: kvstore.Store) -> None:
        store[k(1)] = b"one"
        store[k(2)] = b"two"
        del store[k(1)]
        assert k(1) not in store
        assert k(2) in store
        assert store.get(k(1)) is None
        assert store.get(k(1), b"dflt") == b"dflt"
        assert store.get(k(2), b"dflt") == b"two"
        assert len(store) == 1

    def test_mapping_mixins(self, store: kvstore.Store) -> None:
        store.update({k(1): b"a", k(2): b"b"})
        assert store.pop(k(1)) == b"a"
        assert store.pop(k(1), None) is None
        assert store.setdefault(k(2), b"zzz") == b"b"
        assert store.setdefault(k(3), b"c") == b"c"
        assert dict(store.items()) == {k(2): b"b", k(3): b"c"}

    def test_empty_values(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(1)] = b""
            db[k(2)] = b"x"
            db[k(2)] = b""
            assert db[k(1)] == b"" and db[k(2)] == b""
            assert k(1) in db and len(db) == 2
        with kvstore.open(store_path) as db:
            assert db[k(1)] == b"" and db[k(2)] == b""
            assert len(db) == 2

    def test_keys_with_zero_and_ff_bytes(self, store: kvstore.Store) -> None:
        keys = [b"\x00" * 16, b"\xff" * 16, b"\x00" * 15 + b"\x01", b"\xff" * 15 + b"\xfe"]
        for i, key in enumerate(keys):
            store[key] = v(i)
        for i, key in enumerate(keys):
            assert store[key] == v(i)
        assert set(store) == set(keys)

    def test_len_and_iter(self, store: kvstore.Store) -> None:
        model = {}
        for i in range(300):
            store[k(i)] = v(i)
            model[k(i)] = v(i)
        for i in range(0, 300, 3):
            del store[k(i)]
            del model[k(i)]
        for i in range(0, 300, 7):
            store[k(i)] = b"again"
            model[k(i)] = b"again"
        assert len(store) == len(model)
        listed = list(store)
        assert len(listed) == len(set(listed)) == len(model)
        assert set(listed) == set(model)
        assert all(type(key) is bytes for key in listed)

    def test_survives_close_and_reopen(self, store_path: Path) -> None:
        model = {}
        with kvstore.open(store_path) as db:
            for i in range(500):
                db[k(i)] = v(i)
                model[k(i)] = v(i)
            for i in range(0, 500, 4):
                del db[k(i)]
                del model[k(i)]
            db[k(1)] = b"last"
            model[k(1)] = b"last"
        with kvstore.open(store_path) as db:
            assert len(db) == len(model)
            assert {key: db[key] for key in db} == model
        with kvstore.open(store_path, readonly=True) as db:
            assert {key: db[key] for key in db} == model

    def test_large_value_round_trip(self, store_path: Path) -> None:
        big = os.urandom(3 << 20)
        with kvstore.open(store_path) as db:
            db[k(1)] = big
            assert db[k(1)] == big
        with kvstore.open(store_path) as db:
            assert db[k(1)] == big

    def test_path_and_flags(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            assert Path(db.path).resolve() == store_path.resolve()
            assert db.readonly is False
            assert db.closed is False
        assert db.closed is True
        with kvstore.open(store_path, readonly=True) as ro:
            assert ro.readonly is True

    def test_context_manager_returns_store_and_closes(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(1)] = b"x"
        assert db.closed
        with pytest.raises(StoreClosedError):
            db[k(1)]

    def test_verify_of_healthy_store_is_empty(self, store: kvstore.Store) -> None:
        for i in range(100):
            store[k(i)] = v(i)
        store.flush()
        assert store.verify() == []

    def test_flush_and_sync_keep_data(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(1)] = b"a"
            db.flush()
            db[k(2)] = b"b"
            db.sync()
            with kvstore.open(store_path, readonly=True) as ro:
                assert ro[k(1)] == b"a" and ro[k(2)] == b"b"


class TestInvalidKeys:
    BAD_KEYS = [b"x" * 15, b"x" * 17, b"", "a" * 16, "0123456789abcdef"]

    @pytest.mark.parametrize("bad", BAD_KEYS, ids=["15b", "17b", "empty", "str16", "hexstr"])
    def test_invalid_key_raises_everywhere(self, store: kvstore.Store, bad: object) -> None:
        store[k(1)] = b"x"
        with pytest.raises(InvalidKeyError):
            store[bad] = b"v"  # type: ignore[index]
        with pytest.raises(InvalidKeyError):
            store[bad]  # type: ignore[index]
        with pytest.raises(InvalidKeyError):
            del store[bad]  # type: ignore[arg-type]
        with pytest.raises(InvalidKeyError):
            bad in store  # noqa: B015
        with pytest.raises(InvalidKeyError):
            store.put_many([k(2), bad], [b"a", b"b"])  # type: ignore[list-item]
        with pytest.raises(InvalidKeyError):
            store.contains_many([k(1), bad])  # type: ignore[list-item]
        assert len(store) == 1 and store[k(1)] == b"x"

    def test_invalid_key_error_is_a_value_error(self, store: kvstore.Store) -> None:
        with pytest.raises(ValueError):
            store[b"short"] = b"v"

    @pytest.mark.parametrize("shape", [(3, 15), (3, 17)])
    def test_contains_many_with_wrong_width_array(
        self, store: kvstore.Store, shape: tuple[int, int]
    ) -> None:
        with pytest.raises(InvalidKeyError):
            store.contains_many(np.zeros(shape, dtype=np.uint8))


class TestValueSize:
    def test_value_too_large(self, store_path: Path) -> None:
        with kvstore.open(store_path, max_value_size=100) as db:
            db[k(1)] = b"x" * 100
            with pytest.raises(ValueTooLargeError) as info:
                db[k(2)] = b"x" * 101
            assert isinstance(info.value, ValueError)
            with pytest.raises(ValueTooLargeError):
                db[k(1)] = b"y" * 101
            with pytest.raises(ValueTooLargeError):
                db.put_many([k(3), k(4)], [b"ok", b"z" * 101])
            assert k(2) not in db
            assert db[k(1)] == b"x" * 100
            assert db.verify() == []
        with kvstore.open(store_path) as db:
            assert db[k(1)] == b"x" * 100
            assert k(2) not in db

    def test_default_max_value_size(self) -> None:
        assert kvstore.DEFAULT_MAX_VALUE_SIZE == 64 << 20


class TestClosed:
    def test_close_is_idempotent(self, store_path: Path) -> None:
        db = kvstore.open(store_path)
        db[k(1)] = b"x"
        db.close()
        db.close()
        assert db.closed
        with kvstore.open(store_path) as again:
            assert again[k(1)] == b"x"

    def test_every_operation_after_close_raises(self, store_path: Path) -> None:
        db = kvstore.open(store_path)
        db[k(1)] = b"x"
        db.close()
        ops = [
            lambda: db[k(1)],
            lambda: db.__setitem__(k(2), b"y"),
            lambda: db.__delitem__(k(1)),
            lambda: k(1) in db,
            lambda: len(db),
            lambda: list(db),
            db.random_key,
            lambda: db.contains_many([k(1)]),
            lambda: db.put_many([k(2)], [b"y"]),
            db.flush,
            db.sync,
            db.compact,
            db.stats,
            db.verify,
        ]
        for op in ops:
            with pytest.raises(StoreClosedError):
                op()

    def test_readonly_close_is_idempotent(self, store_path: Path) -> None:
        kvstore.open(store_path).close()
        ro = kvstore.open(store_path, readonly=True)
        ro.close()
        ro.close()
        with pytest.raises(StoreClosedError):
            len(ro)


class TestReadonlyAndPaths:
    def test_readonly_writes_raise(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(1)] = b"x"
        with kvstore.open(store_path, readonly=True) as ro:
            with pytest.raises(ReadOnlyError):
                ro[k(2)] = b"y"
            with pytest.raises(ReadOnlyError):
                del ro[k(1)]
            with pytest.raises(ReadOnlyError):
                ro.put_many([k(3)], [b"z"])
            with pytest.raises(ReadOnlyError):
                ro.compact()
            assert dict(ro.items()) == {k(1): b"x"}

    def test_readonly_open_of_missing_store(self, tmp_path: Path) -> None:
        with pytest.raises(StoreNotFoundError):
            kvstore.open(tmp_path / "nothing", readonly=True)
        assert not (tmp_path / "nothing").exists()

    @pytest.mark.parametrize("readonly", [False, True])
    def test_path_that_is_a_file(self, tmp_path: Path, readonly: bool) -> None:
        path = tmp_path / "afile"
        path.write_bytes(b"not a store")
        with pytest.raises(NotAStoreError):
            kvstore.open(path, readonly=readonly)
        assert path.read_bytes() == b"not a store"


class TestRandomKey:
    def test_random_key_on_empty_store(self, store: kvstore.Store) -> None:
        with pytest.raises(KeyError):
            store.random_key()
        store[k(1)] = b"x"
        del store[k(1)]
        with pytest.raises(KeyError):
            store.random_key()

    def test_random_key_is_live(self, store: kvstore.Store) -> None:
        for i in range(1000):
            store[k(i)] = b""
        for i in range(1000):
            if i % 10:
                del store[k(i)]
        live = {k(i) for i in range(0, 1000, 10)}
        drawn = collections.Counter(store.random_key() for _ in range(3000))
        assert set(drawn) == live  # 100 keys, 3000 draws: a miss has odds ~1e-11

    def test_random_key_is_uniform(self, store: kvstore.Store) -> None:
        keys = [k(i) for i in range(16)]
        for key in keys:
            store[key] = b"v"
        drawn = collections.Counter(store.random_key() for _ in range(16000))
        assert set(drawn) == set(keys)
        # Expected 1000 each, sd ~31: the bounds are 13 sd away and cannot flake.
        assert all(600 <= drawn[key] <= 1400 for key in keys), drawn


class TestBatch:
    def key_forms(self, keys: list[bytes]) -> dict[str, object]:
        raw = b"".join(keys)
        return {
            "list": list(keys),
            "tuple": tuple(keys),
            "uint8": np.frombuffer(raw, dtype=np.uint8).reshape(-1, 16).copy(),
            "V16": np.frombuffer(raw, dtype="V16").copy(),
            "S16": np.frombuffer(raw, dtype="S16").copy(),
        }

    def test_contains_many_input_forms(self, store: kvstore.Store) -> None:
        present = [k(i) for i in range(0, 200, 2)] + [b"\x01" * 8 + b"\x00" * 8]
        for key in present:
            store[key] = b"p"
        asked = [k(i) for i in range(200)] + [b"\x01" * 8 + b"\x00" * 8, b"\x01" * 7 + b"\x00" * 9]
        expected = np.array([key in set(present) for key in asked])
        for name, form in self.key_forms(asked).items():
            got = store.contains_many(form)
            assert isinstance(got, np.ndarray), name
            assert got.dtype == np.bool_, name
            assert got.shape == (len(asked),), name
            assert np.array_equal(got, expected), name

    def test_contains_many_empty(self, store: kvstore.Store) -> None:
        store[k(1)] = b"x"
        assert store.contains_many([]).shape == (0,)
        assert store.contains_many(np.empty((0, 16), dtype=np.uint8)).shape == (0,)

    def test_contains_many_agrees_with_contains_at_scale(self, store: kvstore.Store) -> None:
        keys = [k(i) for i in range(5000)]
        store.put_many(keys[::2], [b""] * len(keys[::2]))
        got = store.contains_many(keys)
        assert got.tolist() == [key in store for key in keys]
        assert got.tolist() == [i % 2 == 0 for i in range(5000)]

    @pytest.mark.parametrize("form", ["list", "uint8", "V16", "S16"])
    def test_put_many_forms(self, store_path: Path, form: str) -> None:
        keys = [k(i) for i in range(300)] + [b"\x00" * 16]
        values = [v(i) for i in range(301)]
        with kvstore.open(store_path) as db:
            db.put_many(self.key_forms(keys)[form], values)
            assert len(db) == 301
            assert all(db[key] == val for key, val in zip(keys, values, strict=True))
        with kvstore.open(store_path) as db:
            assert {key: db[key] for key in db} == dict(zip(keys, values, strict=True))

    def test_put_many_later_duplicates_win(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(0)] = b"before"
            keys = [k(0), k(1), k(0), k(2), k(1), k(0)]
            vals = [b"a", b"b", b"c", b"d", b"e", b"f"]
            db.put_many(keys, vals)
            assert {key: db[key] for key in db} == {k(0): b"f", k(1): b"e", k(2): b"d"}
            # The same at a size that takes the vectorized path.
            big_keys = [k(i % 100) for i in range(1000)]
            big_vals = [str(i).encode() for i in range(1000)]
            db.put_many(big_keys, big_vals)
            expect = {k(i): str(900 + i).encode() for i in range(100)}
            expect[k(0)] = b"900"
            assert {key: db[key] for key in db} == expect
        with kvstore.open(store_path) as db:
            assert {key: db[key] for key in db} == expect

    def test_put_many_overwrites_and_revives(self, store: kvstore.Store) -> None:
        for i in range(100):
            store[k(i)] = b"old"
        for i in range(50):
            del store[k(i)]
        store.put_many([k(i) for i in range(100)], [b"new"] * 100)
        assert len(store) == 100
        assert all(store[k(i)] == b"new" for i in range(100))


class TestStatsAndCompaction:
    def test_stats_fields(self, store: kvstore.Store, data_files) -> None:
        for i in range(10):
            store[k(i)] = b"x" * 10
        store[k(0)] = b"y" * 10
        del store[k(1)]
        store.flush()
        st = store.stats()
        assert isinstance(st, kvstore.StoreStats)
        assert st.records == 12
        assert st.live_keys == 9 == len(store)
        # Live and dead bytes split the VAL file's records between them: the overwritten
        # and the deleted values are dead, and so is the deletion's own 24-byte record.
        assert st.live_bytes == 9 * (24 + 10)
        assert st.dead_bytes == 2 * (24 + 10) + 24
        key_file, val_file = data_files(Path(store.path))
        assert st.key_file_bytes == key_file.stat().st_size == 24 + 12 * 24
        assert st.val_file_bytes == val_file.stat().st_size == 24 + 11 * (24 + 10) + 24
        assert st.index_capacity >= 9
        assert st.index_bytes > 0
        assert 0 < st.load_factor < 1
        assert st.mean_probe_length >= 1

    def test_stats_counts_every_record_across_its_scan_windows(
        self, store: kvstore.Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """stats() reads the records' lengths a window of the VAL file at a time (the
        smallest window here, two 4 KiB granules): many small values and some of 3 KB put
        lengths astride the windows' edges, and the sums are still exact."""
        monkeypatch.setattr(kvstore._stats, "WINDOW_BYTES", 0)
        rng = random.Random(5)
        model = {}
        for i in range(12_000):  # ~40 B a record: a length field astride most edges
            model[k(i)] = v(i, rng.randrange(0, 3000) if i % 50 == 0 else rng.randrange(0, 30))
            store[k(i)] = model[k(i)]
        for i in range(0, 12_000, 7):
            del store[k(i)]
            del model[k(i)]
        store.flush()
        st = store.stats()
        assert st.live_bytes == sum(24 + len(val) for val in model.values())
        assert st.dead_bytes == st.val_file_bytes - 24 - st.live_bytes
        assert st.val_file_bytes > 20 * 8192  # many windows

    def test_compact_reclaims_space_and_keeps_live_records(
        self, store_path: Path, data_files
    ) -> None:
        model = {}
        with kvstore.open(store_path) as db:
            for i in range(400):
                db[k(i)] = v(i, 1000)
                model[k(i)] = v(i, 1000)
            for i in range(0, 400, 2):
                db[k(i)] = v(i + 1, 500)
                model[k(i)] = v(i + 1, 500)
            for i in range(0, 400, 3):
                del db[k(i)]
                del model[k(i)]
            db.flush()
            before = db.stats()
            val_before = data_files(store_path)[1].stat().st_size
            assert before.dead_bytes > 0
            db.compact()
            after = db.stats()
            assert after.dead_bytes == 0
            assert after.live_keys == len(model)
            assert after.live_bytes == sum(24 + len(x) for x in model.values())
            assert after.generation > before.generation
            assert after.records == len(model)
            db.flush()
            _, val_file = data_files(store_path)
            assert val_file.stat().st_size < val_before
            assert val_file.stat().st_size == 24 + sum(24 + len(x) for x in model.values())
            assert {key: db[key] for key in db} == model
            assert db.verify() == []
            # Still writable after compaction.
            db[k("after")] = b"after"
            model[k("after")] = b"after"
            del db[k(1)]
            del model[k(1)]
        key_file, val_file = data_files(store_path)
        assert sorted(p.name for p in store_path.iterdir() if p.suffix in (".key", ".val")) == [
            key_file.name,
            val_file.name,
        ]
        with kvstore.open(store_path) as db:
            assert {key: db[key] for key in db} == model

    def test_compact_empty_store(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[k(1)] = b"x"
            del db[k(1)]
            db.compact()
            assert len(db) == 0
            assert db.stats().dead_bytes == 0
        with kvstore.open(store_path) as db:
            assert len(db) == 0

    def test_capacity_hint(self, tmp_path: Path) -> None:
        with kvstore.open(tmp_path / "small") as small:
            small_cap = small.stats().index_capacity
        with kvstore.open(tmp_path / "hinted", capacity=50_000) as db:
            cap = db.stats().index_capacity
            assert cap >= 50_000 > small_cap
            db.put_many([k(i) for i in range(40_000)], [b""] * 40_000)
            assert db.stats().index_capacity == cap  # no growth below the hint


class TestOnDiskLayout:
    """The layout docs/FORMAT.md promises: the recovery tests rely on it too."""

    def test_files_headers_and_records(self, store_path: Path, data_files) -> None:
        values = [b"alpha", b"", b"x" * 300]
        with kvstore.open(store_path) as db:
            for i, val in enumerate(values):
                db[k(i)] = val
            del db[k(0)]
        names = sorted(p.name for p in store_path.iterdir() if p.is_file())
        assert "LOCK" in names
        key_file, val_file = data_files(store_path)
        assert (
            key_file.name[:5] == "data-"
            and key_file.stem[5:].isdigit()
            and len(key_file.stem) == 11
        )
        assert val_file.stem == key_file.stem
        gen = int(key_file.stem[5:])
        kb, vb = key_file.read_bytes(), val_file.read_bytes()
        for data, magic in ((kb, b"KVSTKEY\n"), (vb, b"KVSTVAL\n")):
            # version 3; bytes 12..15: CRC32 of header bytes 0..11 and 16..23
            head, tail = struct.pack("<8sI", magic, 3), struct.pack("<Q", gen)
            assert data[:24] == head + struct.pack("<I", zlib.crc32(tail, zlib.crc32(head))) + tail
        assert len(kb) == 24 + 4 * 24
        offsets = []
        pos = 24
        # A record: u32 length (0xFFFFFFFF: a deletion), u32 CRC32 of the length field,
        # key and value, the 16-byte key, the value.
        for key, val in [(k(0), values[0]), (k(1), values[1]), (k(2), values[2]), (k(0), None)]:
            length = 0xFFFF_FFFF if val is None else len(val)
            crc = zlib.crc32(val or b"", zlib.crc32(key, zlib.crc32(struct.pack("<I", length))))
            assert vb[pos : pos + 24] == struct.pack("<II", length, crc) + key
            assert vb[pos + 24 : pos + 24 + len(val or b"")] == (val or b"")
            offsets.append(pos)
            pos += 24 + len(val or b"")
        assert len(vb) == pos
        recs = [struct.unpack_from("<16sq", kb, 24 + 24 * j) for j in range(4)]
        assert recs == [(k(0), offsets[0]), (k(1), offsets[1]), (k(2), offsets[2]), (k(0), -1)]


# A child hits a real file size limit (RLIMIT_FSIZE stands in for a full disk: the
# kernel writes up to the limit, then refuses with EFBIG), so the flush that fails
# has really written part of its bytes, and the parent's own writes are not limited.
FLUSH_FAILURE_CHILD = r"""
import glob, json, os, resource, signal, sys
import kvstore
path, which, then, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def sizes():
    (key,) = glob.glob(os.path.join(path, "data-*.key"))
    (val,) = glob.glob(os.path.join(path, "data-*.val"))
    return [os.path.getsize(key), os.path.getsize(val)]
pending = json.loads(sys.argv[5])
db = kvstore.open(path)
db[b"k" * 16] = b"first"
db.flush()
out = {"good": sizes()}
for key, value in pending:
    db[bytes.fromhex(key)] = bytes.fromhex(value)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
try:
    db.flush()
    out["error"] = None
except OSError as exc:
    out["error"] = exc.errno
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
out["after_failure"] = sizes()
out["readable"] = all(db[bytes.fromhex(k)] == bytes.fromhex(v) for k, v in pending)
if then == "abandon":
    db.abandon()
    out["after_abandon"] = sizes()
else:
    db.flush()
    out["after_retry"] = sizes()
    db.close()
print(json.dumps(out))
"""

FLUSH_LIMIT = 4096


def failing_batch(which: str) -> list[tuple[bytes, bytes]]:
    """The writes buffered when the limit is hit: VAL crosses it, or only KEY does
    (empty values in a format 2 store: 24 KEY bytes a record against 8 VAL bytes; in
    format 3 a VAL record is never smaller than its KEY record, so VAL always crosses
    first, but the flush that undoes a failed KEY write is the same code)."""
    if which == "val":
        return [(b"j" * 16, b"x" * 8192)]
    return [(k(i), b"") for i in range(200)]


@pytest.mark.parametrize("then", ["abandon", "retry"])
@pytest.mark.parametrize("which", ["val", "key"])
def test_a_failed_flush_writes_nothing_partial_and_abandon_drops_the_buffer(
    tmp_path: Path,
    python: str,
    child_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    which: str,
    then: str,
) -> None:
    """What an embedder with several stores relies on after a full disk: the files
    keep exactly the last good flush (sizes checked before any reopen, so recovery
    cannot hide stray bytes), the buffer survives the failure, abandon() closes
    without writing it, a retry once space is back writes it whole, and no open
    afterwards has anything to recover."""
    path = tmp_path / "s"
    batch = failing_batch(which)
    hdr = 24  # a VAL record's header in format 3
    if which == "key":
        write_plain_store(path, [])
        hdr = 8
    out = subprocess.run(
        [
            python,
            "-c",
            FLUSH_FAILURE_CHILD,
            str(path),
            which,
            then,
            str(FLUSH_LIMIT),
            json.dumps([[key.hex(), value.hex()] for key, value in batch]),
        ],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    good_key, good_val = res["good"]
    assert (good_key, good_val) == (24 + 24, 24 + hdr + 5)
    key_bytes = 24 * len(batch)
    val_bytes = sum(hdr + len(value) for _, value in batch)
    # The failing write is a real partial one: it starts below the limit and ends past it.
    if which == "val":
        assert good_val < FLUSH_LIMIT < good_val + val_bytes
    else:
        assert good_val + val_bytes <= FLUSH_LIMIT  # VAL's write succeeds...
        assert good_key < FLUSH_LIMIT < good_key + key_bytes  # ...KEY's is cut short
    assert res["error"] == 27  # EFBIG
    assert res["after_failure"] == [good_key, good_val], "a failed flush left bytes behind"
    assert res["readable"], "the buffered writes were lost by the failed flush"
    if then == "abandon":
        assert res["after_abandon"] == [good_key, good_val]
        expected = {b"k" * 16: b"first"}
    else:
        assert res["after_retry"] == [good_key + key_bytes, good_val + val_bytes]
        expected = {b"k" * 16: b"first", **dict(batch)}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvstore"), kvstore.open(path) as again:
        assert dict(again.items()) == expected
        assert again.verify() == []
    assert not (path / "recovered").exists(), "the next open had to recover a torn flush"
    assert not [r for r in caplog.records if r.name.startswith("kvstore")], caplog.text


def test_sync_fsyncs_both_files_after_the_last_write(
    store_path: Path, data_files, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync() is what survives a power loss: it must fsync the KEY and the VAL file,
    once they hold the last write (a spy records which file each fsync reached and
    its size then, and calls the real fsync)."""
    real_fsync = os.fsync
    synced: list[tuple[str, int]] = []

    def spy(fd: int) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        synced.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), os.fstat(fd).st_size))
        real_fsync(fd)

    with kvstore.open(store_path) as db:
        db[k(1)] = b"a" * 100
        db.flush()
        db[k(2)] = b"b" * 50  # still buffered: sync must write it, then fsync
        del db[k(1)]
        monkeypatch.setattr(os, "fsync", spy)
        db.sync()
        monkeypatch.undo()
        key_file, val_file = data_files(store_path)
        key_size, val_size = 24 + 3 * 24, 24 + (24 + 100) + (24 + 50) + 24  # and the deletion
        assert (key_file.stat().st_size, val_file.stat().st_size) == (key_size, val_size)
        assert (key_file.name, key_size) in synced, synced
        assert (val_file.name, val_size) in synced, synced


def test_sync_lets_other_threads_read_and_write_during_its_fsync(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync can take a second on a busy disk: the crawler's committer must keep
    writing meanwhile. A spy holds sync()'s first fsync until this thread has put,
    got and flushed through the same store."""
    real_fsync = os.fsync
    in_fsync, release = threading.Event(), threading.Event()

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        assert release.wait(10), "the test never released the fsync"
        real_fsync(fd)

    with kvstore.open(store_path) as db:
        db[k(1)] = b"one"
        monkeypatch.setattr(os, "fsync", slow_fsync)
        syncer = threading.Thread(target=db.sync)
        syncer.start()
        try:
            assert in_fsync.wait(10)
            done = threading.Event()

            def use() -> None:
                db[k(2)] = b"two"
                assert db[k(1)] == b"one"
                db.flush()
                done.set()

            user = threading.Thread(target=use, daemon=True)
            user.start()
            assert done.wait(5), "a put, get and flush waited for another thread's fsync"
        finally:
            release.set()
            syncer.join(10)
        monkeypatch.undo()
        assert not syncer.is_alive()
        assert db[k(2)] == b"two"


def _all_error_classes() -> set[type[KVStoreError]]:
    return {
        cls
        for cls in vars(kvstore.exceptions).values()
        if isinstance(cls, type) and issubclass(cls, KVStoreError) and cls is not KVStoreError
    }


# Each deliberate error, provoked for real. The permission case runs in a child for
# which file modes hold (as root, it drops the capabilities that bypass them).
PERMISSION_ERROR_CHILD = r"""
import os, sys
import kvstore
store = sys.argv[1]
try:
    os.listdir(store)
    print("PERMISSIONS-NOT-ENFORCED")
    sys.exit(0)
except PermissionError:
    pass
try:
    kvstore.open(store)
    print("OPENED")
except BaseException as exc:
    print(type(exc).__name__, isinstance(exc, kvstore.exceptions.KVStoreError))
"""


class TestEveryDeliberateErrorIsAKVStoreError:
    CASES = [
        "InvalidKeyError",
        "ValueTooLargeError",
        "StoreClosedError",
        "ReadOnlyError",
        "StoreLockedError",
        "StoreNotFoundError",
        "NotAStoreError",
        "StorePermissionError",
        "CorruptStoreError",
        "UnsupportedVersionError",
    ]

    def test_the_cases_cover_every_error_class(self) -> None:
        assert {getattr(kvstore.exceptions, name) for name in self.CASES} == _all_error_classes()

    def provoke(self, name: str, tmp_path: Path, unprivileged_child, data_files) -> BaseException:
        path = tmp_path / "store"
        with kvstore.open(path) as db:
            db[k(1)] = b"one"
            db[k(2)] = b"two"
        key_file, val_file = data_files(path)
        if name == "StorePermissionError":
            path.chmod(0)
            try:
                out = unprivileged_child(PERMISSION_ERROR_CHILD, str(path))
            finally:
                path.chmod(0o755)
            assert out.returncode == 0, out.stderr
            if out.stdout.strip() == "PERMISSIONS-NOT-ENFORCED":
                pytest.skip("this environment cannot drop the capabilities that bypass modes")
            assert out.stdout.split() == ["StorePermissionError", "True"], out.stdout
            return kvstore.exceptions.StorePermissionError(13, "reported by the child")
        with pytest.raises(Exception) as info:  # noqa: B017 - the class is checked below
            if name == "InvalidKeyError":
                with kvstore.open(path) as db:
                    db[b"short"] = b"x"
            elif name == "ValueTooLargeError":
                with kvstore.open(path, max_value_size=10) as db:
                    db[k(3)] = b"x" * 11
            elif name == "StoreClosedError":
                db = kvstore.open(path)
                db.close()
                db[k(1)]
            elif name == "ReadOnlyError":
                with kvstore.open(path, readonly=True) as ro:
                    ro[k(3)] = b"x"
            elif name == "StoreLockedError":
                with kvstore.open(path):
                    kvstore.open(path)
            elif name == "StoreNotFoundError":
                kvstore.open(tmp_path / "missing", readonly=True)
            elif name == "NotAStoreError":
                (tmp_path / "file").write_bytes(b"x")
                kvstore.open(tmp_path / "file")
            elif name == "CorruptStoreError":
                data = bytearray(val_file.read_bytes())
                data[24 + 8] ^= 1  # k(1)'s value, outside the tail checked on open
                val_file.write_bytes(bytes(data))
                with kvstore.open(path, readonly=True, tail_check_bytes=0) as ro:
                    ro[k(1)]
            elif name == "UnsupportedVersionError":
                data = bytearray(key_file.read_bytes())
                struct.pack_into("<I", data, 8, 99)
                head = bytes(data[16:24]), bytes(data[:12])  # the header checksum's bytes
                struct.pack_into("<I", data, 12, zlib.crc32(head[0], zlib.crc32(head[1])))
                key_file.write_bytes(bytes(data))
                kvstore.open(path)
        return info.value

    @pytest.mark.parametrize("name", CASES)
    def test_error_is_a_kvstore_error(
        self, tmp_path: Path, unprivileged_child, data_files, name: str
    ) -> None:
        exc = self.provoke(name, tmp_path, unprivileged_child, data_files)
        assert type(exc) is getattr(kvstore.exceptions, name)
        assert isinstance(exc, KVStoreError)


def test_stamp_changes_with_every_write_and_a_compaction_and_only_then(tmp_path: Path) -> None:
    path = tmp_path / "db"
    assert kvstore.stamp(str(path)) is None  # no directory
    path.mkdir()
    assert kvstore.stamp(str(path)) is None  # no store in it
    with kvstore.open(path) as db:
        db[b"a" * 16] = b"one"
        db.flush()
        first = kvstore.stamp(str(path))
        assert first is not None and first[0] == db.versions()[0]
        _ = db[b"a" * 16], b"a" * 16 in db  # reads write nothing
        assert kvstore.stamp(str(path)) == first
        db[b"a" * 16] = b"one"  # the same value again is still a write
        db.flush()
        second = kvstore.stamp(str(path))
        assert second is not None and second[0] == first[0] and second != first
        del db[b"a" * 16]
        db.flush()
        third = kvstore.stamp(str(path))
        assert third is not None and third[1] > second[1] and third[2] > second[2]
        db[b"b" * 16] = b"two"
        db.compact()
        after = kvstore.stamp(str(path))
        assert after is not None and after[0] == db.versions()[0] != first[0]
    with kvstore.open(path, readonly=True):
        assert kvstore.stamp(str(path)) == after  # opening and closing write nothing


def test_iteration_follows_the_val_file(tmp_path: Path) -> None:
    """Keys come in the order their records lie in the VAL file (the last write of each),
    so a loop reading every value reads the file front to back; before and after a
    reopen and a compaction."""
    keys = [hashlib.md5(str(i).encode()).digest() for i in range(2000)]
    with kvstore.open(tmp_path / "db") as db:
        for k in keys:
            db[k] = b"v" * 10
        moved = keys[::7]
        for k in moved:  # written again: their records are now at the end
            db[k] = b"w" * 10
        for k in keys[1::7]:
            del db[k]
        want = [k for k in keys if k not in set(moved) | set(keys[1::7])] + moved
        assert list(db) == want
        assert [k for k, _ in db.items()] == want
    with kvstore.open(tmp_path / "db") as db:
        assert list(db) == want
        db.compact()
        assert list(db) == want  # a compaction copies the live records in that order


def test_versions_of_agrees_with_versions_and_follows_every_write(tmp_path: Path) -> None:
    keys = [kvstore.md5_key(str(i)) for i in range(300)]
    absent = kvstore.md5_key("absent")
    with kvstore.open(tmp_path / "db") as db:
        db.put_many(keys, [b"v%d" % i for i in range(300)])
        gen, all_keys, all_versions = db.versions()
        snapshot = dict(zip((k.tobytes() for k in all_keys), all_versions.tolist(), strict=True))
        got_gen, got = db.versions_of([*keys, absent])
        assert got_gen == gen
        assert got.tolist() == [snapshot[k] for k in keys] + [-1]
        db[keys[0]] = b"again"  # a rewrite: a new version, the others as they were
        del db[keys[1]]
        _, after = db.versions_of(keys)
        assert after[0] != got[0] and after[0] >= 0 and after[1] == -1
        assert after[2:].tolist() == got[2:300].tolist()
        db.compact()
        assert db.versions_of(keys[:1])[0] != gen  # versions compare only within one
        with pytest.raises(kvstore.exceptions.InvalidKeyError):
            db.versions_of([b"short"])
