"""C twins of the bulk paths and of the owners' lock, against their pure-Python
references (see test_speedups.py for the method): the segment rebuild
(``_rehash``), a big ``put_many``'s value check (``_check_values``), the CRC check
of the VAL tail on open (``check_val_records``) and ``Lock``."""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_speedups import (
    POOL_ARR,
    STORE_VALUES,
    TWINS,
    PyHashIndex,
    PySegment,
    files_of,
    outcome,
    require_c,
)

from kvstore import _backend, _fallback
from kvstore import _format as fmt
from kvstore._index import HashIndex, _Segment, next_prime
from kvstore._store import Store

pytestmark = pytest.mark.ci_may_skip(
    "KVSTORE_PURE_PYTHON=1: the pure-Python backend is forced, so there is no C backend "
    "to compare it with"
)


@given(
    seed=st.integers(0, 2**32),
    width=st.sampled_from([1, 6, 8]),
    fill=st.floats(0.0, 0.78),
    deleted=st.floats(0.0, 0.5),
    grow=st.sampled_from([1.0, 1.3, 3.0]),
)
@settings(max_examples=60, deadline=None)
def test_rehash_builds_the_same_segment(
    seed: int, width: int, fill: float, deleted: float, grow: float
) -> None:
    """A segment with live, deleted and empty slots rebuilt into a fresh one (and into
    one that already holds keys): the same slots and counts from C and from Python."""
    require_c()
    rng = np.random.default_rng(seed)
    c, py = HashIndex(width), PyHashIndex(width)
    cap = int(rng.choice([127, 131, 257, 1031]))
    n = int(fill * cap)
    keys = POOL_ARR[rng.choice(len(POOL_ARR), n, replace=False)]
    vals = rng.integers(0, 100, n)
    vals[rng.random(n) < deleted] = -1
    olds = []
    for idx, seg_type in ((c, _Segment), (py, PySegment)):
        old = seg_type(cap, width)
        idx._insert_segment(old, keys, idx.hashes(keys), vals)
        olds.append(old)
    # Room for the live keys and the extra ones below: a full table never ends a walk.
    new_cap = next_prime(int((olds[0].live + 25) * grow / 0.78) + 1)
    news = [_Segment(new_cap, width), PySegment(new_cap, width)]
    if rng.random() < 0.3:  # a target that is not empty
        extra = POOL_ARR[rng.choice(len(POOL_ARR), 20, replace=False)]
        for idx, new in zip((c, py), news, strict=True):
            idx._insert_segment(new, extra, idx.hashes(extra), np.arange(len(extra)))
    pairs = zip((c, py), olds, news, strict=True)
    got = [outcome(idx._rehash, old, new) for idx, old, new in pairs]
    assert got[0][0] == got[1][0]
    seg_c, seg_py = news
    assert (bytes(seg_c.kmv), bytes(seg_c.vmv)) == (bytes(seg_py.kmv), bytes(seg_py.vmv))
    assert (seg_c.live, seg_c.deleted) == (seg_py.live, seg_py.deleted)


def test_rehash_refuses_what_it_cannot_walk() -> None:
    require_c()
    index = HashIndex(6)
    seg = index._segs[0]
    with pytest.raises(ValueError):
        index._rehash(seg, seg)
    with pytest.raises(TypeError):
        index._rehash(PySegment(127, 6), seg)


def test_check_values_matches(tmp_path: Path) -> None:
    """A big put_many's values are checked as a put checks them, C and pure alike:
    the same list back, or the same error for the first bad one."""
    require_c()
    runs = []
    for name, classes in TWINS:
        db = classes[0](tmp_path / name, max_value_size=10)
        try:
            got = {}
            for j, value in enumerate(STORE_VALUES):
                got[j] = outcome(db._check_values, [b"ok", value, b"x"])
            got["tuple"] = outcome(db._check_values, (b"a", bytearray(b"b")))
            got["empty"] = outcome(db._check_values, [])
            runs.append(got)
        finally:
            db.close()
    assert runs[0] == runs[1]


def test_a_big_put_many_with_a_bad_value_writes_nothing(tmp_path: Path) -> None:
    from kvstore import _store

    n = _store.PUT_MANY_CHUNK + 10
    keys = np.frombuffer(np.random.default_rng(3).bytes(16 * n), dtype=np.uint8).reshape(n, 16)
    results = []
    for name, classes in TWINS if _backend.BACKEND == "c" else TWINS[:1]:
        with classes[0](tmp_path / name, max_value_size=10) as db:
            values = [b"v"] * n
            values[-1] = b"x" * 11
            results.append(outcome(db.put_many, keys, values))
            assert len(db) == 0
            values[-1] = bytearray(b"ok")
            db.put_many(keys, values)
            assert len(db) == n and db[keys[-1].tobytes()] == b"ok"
    assert results[0][0] == "raise"
    assert all(r == results[0] for r in results)
    if len(results) == 2:
        assert files_of(tmp_path / "c") == files_of(tmp_path / "py")


# --------------------------------------------------------------------------- VAL records


def _val_file(values: list[bytes]) -> tuple[bytearray, list[int]]:
    data = bytearray(fmt.pack_header(fmt.VAL_MAGIC, 1))
    offs = []
    for v in values:
        offs.append(len(data))
        data += struct.pack("<II", len(v), zlib.crc32(v)) + v
    return data, offs


def _c_check() -> object:
    from kvstore import _speedups  # type: ignore[attr-defined]

    return _speedups.check_val_records


@given(
    values=st.lists(st.binary(max_size=40) | st.binary(min_size=2040, max_size=2100), max_size=12),
    damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
    shuffle=st.sampled_from(["none", "swap", "repeat", "wild"]),
    cut=st.integers(0, 30),
    prev=st.sampled_from([None, 0, 10**6]),
)
@settings(max_examples=150, deadline=None)
def test_check_val_records_matches(
    values: list[bytes],
    damage: list[tuple[int, int]],
    shuffle: str,
    cut: int,
    prev: int | None,
) -> None:
    """Intact, damaged, reordered, repeated and wild offsets, a VAL file cut short: C
    passes exactly the records Python passes, and ends where it ends."""
    require_c()
    data, offs = _val_file(values)
    for pos, flip in damage:
        data[pos % len(data)] ^= flip
    if shuffle == "swap" and len(offs) > 1:
        offs[0], offs[1] = offs[1], offs[0]
    elif shuffle == "repeat" and offs:
        offs.insert(len(offs) // 2, offs[len(offs) // 2])
    elif shuffle == "wild":
        offs += [-5, 0, 23, len(data) - 3, len(data) + 100, 2**62]
    size = max(0, len(data) - cut)
    arr = np.array(offs, dtype=np.int64)
    prev_end = fmt.HEADER_SIZE if prev is None else prev
    want = _fallback.check_val_records(bytes(data), arr, size, prev_end)
    assert _c_check()(bytes(data), arr, size, prev_end) == want  # type: ignore[operator]
    # The pure twin is check_val_record applied in turn: the count stops at its first failure.
    end, passed = prev_end, 0
    for off in offs:
        problem, rec_end = fmt.check_val_record(bytes(data), off, size, end)
        if problem is not None:
            break
        end, passed = rec_end, passed + 1
    assert want == (passed, end)


def test_check_val_records_refuses_bad_arguments() -> None:
    require_c()
    fn = _c_check()
    data, offs = _val_file([b"abc"])
    for size in (-1, len(data) + 1):
        for impl in (fn, _fallback.check_val_records):
            with pytest.raises(ValueError):
                impl(bytes(data), np.array(offs, dtype=np.int64), size, 24)  # type: ignore[operator]
    with pytest.raises(ValueError):
        fn(bytes(data), np.array(offs, dtype=np.int32), len(data), 24)  # type: ignore[operator]


def _keyed_files(ops: list[tuple[bytes, bytes | None]]) -> tuple[bytearray, bytearray]:
    """A keyed VAL file and its KEY records (no header) for (key, value or None) ops."""
    data = bytearray(fmt.pack_header(fmt.VAL_MAGIC, 1))
    records = bytearray()
    for key, value in ops:
        pos = len(data)
        if value is None:
            data += fmt.pack_deletion(key)
        else:
            data += fmt.pack_keyed_header(key, value) + value
        records += fmt.pack_key_record(key, fmt.TOMBSTONE if value is None else pos)
    return data, records


def _c_keyed_check() -> object:
    from kvstore import _speedups  # type: ignore[attr-defined]

    return _speedups.check_keyed_records


@given(
    ops=st.lists(
        st.tuples(st.sampled_from([bytes([i]) * 16 for i in range(4)]),
                  st.none() | st.binary(max_size=40) | st.binary(min_size=2040, max_size=2100)),
        max_size=12,
    ),
    damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
    key_damage=st.lists(st.tuples(st.integers(0, 10**4), st.integers(1, 255)), max_size=2),
    cut=st.integers(0, 30),
    start=st.sampled_from([None, 0, 25, 10**6]),
)
@settings(max_examples=200, deadline=None)
def test_check_keyed_records_matches(
    ops: list[tuple[bytes, bytes | None]],
    damage: list[tuple[int, int]],
    key_damage: list[tuple[int, int]],
    cut: int,
    start: int | None,
) -> None:
    """Intact and damaged VAL records (values, deletions), damaged KEY records (keys and
    offsets), a VAL file cut short, a wrong start: C passes exactly the records Python
    passes, and ends where it ends."""
    require_c()
    data, records = _keyed_files(ops)
    for pos, flip in damage:
        data[pos % len(data)] ^= flip
    for pos, flip in key_damage:
        if records:
            records[pos % len(records)] ^= flip
    size = max(0, len(data) - cut)
    pos0 = fmt.HEADER_SIZE if start is None else start
    raw = np.frombuffer(bytes(records), dtype=np.uint8)
    want = _fallback.check_keyed_records(bytes(data), raw, size, pos0)
    assert _c_keyed_check()(bytes(data), raw, size, pos0) == want  # type: ignore[operator]
    # The pure twin is check_keyed_record applied in step: it stops at the first failure.
    pos, passed = pos0, 0
    for i in range(0, len(records), fmt.KEY_RECORD_SIZE):
        key = bytes(records[i : i + 16])
        off = struct.unpack_from("<q", records, i + 16)[0]
        problem, end = fmt.check_keyed_record(bytes(data), pos, size, key, off)
        if problem is not None:
            break
        pos, passed = end, passed + 1
    assert want == (passed, pos)
    if not damage and not key_damage and not cut and start is None:
        assert want == (len(ops), len(data))  # a sound file passes whole


def test_check_keyed_records_refuses_bad_arguments() -> None:
    require_c()
    fn = _c_keyed_check()
    data, records = _keyed_files([(b"k" * 16, b"abc")])
    raw = np.frombuffer(bytes(records), dtype=np.uint8)
    for size in (-1, len(data) + 1):
        for impl in (fn, _fallback.check_keyed_records):
            with pytest.raises(ValueError):
                impl(bytes(data), raw, size, 24)  # type: ignore[operator]
    for impl in (fn, _fallback.check_keyed_records):
        with pytest.raises(ValueError):  # not whole 24-byte records
            impl(bytes(data), raw[:-1], len(data), 24)  # type: ignore[operator]


def test_the_open_uses_the_check_it_was_built_with() -> None:
    from kvstore import _mend, _recovery

    assert _recovery.check_val_records is _backend.check_val_records
    assert _mend.check_keyed_records is _backend.check_keyed_records
    want = "c" if _backend.BACKEND == "c" else "python"
    module = getattr(_backend.check_val_records, "__module__", None) or "kvstore._speedups"
    assert (module == "kvstore._fallback") is (want == "python")


def test_open_stops_at_the_first_bad_tail_record_either_way(tmp_path: Path) -> None:
    """The tail check on open cuts at the same record whichever twin runs it, in a
    keyed store (check_keyed_records) and in a format 2 one (check_val_records)."""
    require_c()
    from plain_format import write_plain_store

    from kvstore import _mend, _recovery

    reports = []
    pairs = [("check_keyed_records", impl) for impl in
             (_backend.check_keyed_records, _fallback.check_keyed_records)]
    pairs += [("check_val_records", impl) for impl in
              (_backend.check_val_records, _fallback.check_val_records)]
    for name, impl in pairs:
        path = tmp_path / f"{name}-{impl.__module__}"
        if name == "check_keyed_records":
            with Store(path) as db:
                for i in range(200):
                    db[POOL_ARR[i].tobytes()] = b"value %d" % i
                    if i % 7 == 0:
                        del db[POOL_ARR[i // 2].tobytes()]
            (path / "data-000001.idx").unlink()
        else:
            write_plain_store(path, [(POOL_ARR[i].tobytes(), b"value %d" % i) for i in range(200)])
        val = path / "data-000001.val"
        data = bytearray(val.read_bytes())
        data[-3] ^= 1  # the last record's value: a torn write, as nothing sound follows
        val.write_bytes(bytes(data))
        module = _mend if name == "check_keyed_records" else _recovery
        orig = getattr(module, name)
        setattr(module, name, impl)
        try:
            with Store(path, readonly=True) as db:
                reports.append((len(db), db.recovery.tail if db.recovery else None))
        finally:
            setattr(module, name, orig)
    assert reports[0] == reports[1] and reports[2] == reports[3]
    for count, tail in reports:
        assert tail is not None and count < 200


# --------------------------------------------------------------------------- the lock


def _lock_script(lock: object) -> list[object]:
    """What a lock does, step by step, as comparable outcomes."""
    return [
        outcome(lock.locked),  # type: ignore[attr-defined]
        outcome(lock.acquire),  # type: ignore[attr-defined]
        outcome(lock.locked),  # type: ignore[attr-defined]
        outcome(lock.acquire, False),  # type: ignore[attr-defined]
        outcome(lock.acquire, timeout=0.01),  # type: ignore[attr-defined]
        outcome(lock.acquire, blocking=False, timeout=1),  # type: ignore[attr-defined]
        outcome(lock.acquire, timeout=-2),  # type: ignore[attr-defined]
        outcome(lock.release),  # type: ignore[attr-defined]
        outcome(lock.release),  # type: ignore[attr-defined]
        outcome(lock.acquire, True, 0.5),  # type: ignore[attr-defined]
        outcome(lock.__exit__, None, None, None),  # type: ignore[attr-defined]
        outcome(lock.__enter__),  # type: ignore[attr-defined]
        outcome(lock.locked),  # type: ignore[attr-defined]
        outcome(lock.__exit__, None, None, None),  # type: ignore[attr-defined]
    ]


def test_the_lock_behaves_as_threading_lock() -> None:
    assert _lock_script(_backend.Lock()) == _lock_script(threading.Lock())
    assert _fallback.Lock is threading.Lock


def test_the_lock_excludes_other_threads_and_wakes_them() -> None:
    lock = _backend.Lock()
    inside = 0
    seen: list[int] = []

    def work() -> None:
        nonlocal inside
        for _ in range(2000):
            with lock:
                inside += 1
                seen.append(inside)
                inside -= 1

    old = __import__("sys").getswitchinterval()
    __import__("sys").setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        __import__("sys").setswitchinterval(old)
    assert set(seen) == {1} and len(seen) == 8000
    lock.acquire()
    released = threading.Event()

    def waiter() -> None:
        with lock:
            released.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert not released.wait(0.05)  # blocked while we hold it
    lock.release()
    t.join()
    assert released.is_set() and not lock.locked()


def test_the_owners_use_the_backends_lock(tmp_path: Path) -> None:
    from kvstore._keysets import KeyIntMap, KeySet

    lock_type = type(_backend.Lock())  # threading.Lock is a factory function
    with Store(tmp_path / "s") as db:
        assert type(db._lock) is lock_type
    assert type(KeySet()._lock) is type(KeyIntMap()._lock) is lock_type
