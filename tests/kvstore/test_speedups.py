"""The C accelerator (kvstore._speedups) against its pure-Python reference (kvstore._fallback).

Both are driven with the same operations and must leave byte-identical segment
arrays and files, return the same results and raise the same exceptions. The
pure twin of a class is the class itself with every method its C base provides
replaced by the _fallback function of the same name (so the Python halves are
shared), on segments that are plain pure-Python objects.

With the C backend active everything here runs. If the extension is not built
the comparisons *fail* (a silent fallback would hide a broken build), unless
KVSTORE_PURE_PYTHON=1 says the pure backend is wanted: then they are skipped,
with that reason, and the behaviour tests run against the pure code alone.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import kvstore
from kvstore import _backend, _fallback
from kvstore import _format as fmt
from kvstore._index import HashIndex, _Segment
from kvstore._keysets import KeyIntMap, KeySet
from kvstore._store import Store
from kvstore.exceptions import (
    CorruptStoreError,
    InvalidKeyError,
    ReadOnlyError,
    StoreClosedError,
)

C_ACTIVE = _backend.BACKEND == "c"
PURE_REASON = (
    "KVSTORE_PURE_PYTHON=1: the pure-Python backend is forced, so there is no C backend "
    "to compare it with"
)
REPO_ROOT = Path(__file__).resolve().parents[2]
# A skip here only ever means the pure backend was forced on purpose (.ci/run does, for
# its second pass): require_c() fails instead when the C extension is missing.
pytestmark = pytest.mark.ci_may_skip(PURE_REASON)


def require_c() -> None:
    """Skip (pure backend forced on purpose) or fail (C extension missing)."""
    if _backend.FORCE_PURE:
        pytest.skip(PURE_REASON)
    if not C_ACTIVE:
        pytest.fail(
            "kvstore._speedups is not built: run `pip install -e .` "
            "(or set KVSTORE_PURE_PYTHON=1 to test the pure-Python backend on purpose)"
        )


# --------------------------------------------------------------------------- pure twins


def pure_twin(cls: type, **extra: Any) -> type:
    """``cls`` with the methods of its C base replaced by the _fallback ones."""
    c_base = next((b for b in cls.__mro__ if b.__module__ == "kvstore._speedups"), None)
    if c_base is None:  # the pure backend is active: cls already is its own twin
        return cls
    py_base = getattr(_fallback, c_base.__name__)
    ns = {
        name: obj
        for name, obj in vars(py_base).items()
        if isinstance(obj, types.FunctionType | staticmethod)
    }
    ns.update(extra)
    return type("Py" + cls.__name__, (cls,), ns)


class PySegment(_fallback.SegmentBase):
    """A segment with pure-Python slots: C code refuses it, so a twin cannot use C."""

    __slots__ = ()
    __init__ = _Segment.__init__
    nbytes = _Segment.nbytes


PyHashIndex = pure_twin(HashIndex, _segment=PySegment)


def to_pure(index: HashIndex) -> HashIndex:
    """A PyHashIndex holding a copy of ``index``'s table."""
    twin = PyHashIndex(index.width)
    segs = []
    for s in index._segs:
        seg = PySegment(s.cap, index.width)
        seg.kmv[:] = s.kmv
        seg.vmv[:] = s.vmv
        seg.live, seg.deleted = s.live, s.deleted
        segs.append(seg)
    twin._segs = segs
    return twin


def _pure_load(self: Store, *args: Any, **kwargs: Any) -> Any:
    g = Store._load(self, *args, **kwargs)
    g.index = to_pure(g.index)  # the open's own build is compared in TestIndexTwins
    return g


PyStore = pure_twin(Store, _load=_pure_load) if C_ACTIVE else Store
PyKeySet = pure_twin(KeySet, _index_type=PyHashIndex)
PyKeyIntMap = pure_twin(KeyIntMap, _index_type=PyHashIndex)


def table(index: HashIndex) -> list[tuple[int, int, int, bytes, bytes]]:
    return [(s.cap, s.live, s.deleted, bytes(s.kmv), bytes(s.vmv)) for s in index._segs]


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """What ``fn(*args, **kwargs)`` does: ("ok", result) or ("raise", (type, message))."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - comparing what each backend raises
        return "raise", (type(exc), str(exc))


# A key pool small enough that batches repeat keys and deletes hit; md5 digests and
# counters in both byte orders (the hash must spread both).
# 4,000 distinct keys: md5 keys, and small integers in both byte orders (from 1 in
# little-endian: 0 is the same key either way, and the batch tests' contract is a batch
# of distinct keys, which that duplicate broke when hypothesis drew it).
POOL = [kvstore.md5_key(str(i)) for i in range(3000)] + [
    i.to_bytes(16, "big") for i in range(500)
] + [i.to_bytes(16, "little") for i in range(1, 501)]
assert len(set(POOL)) == len(POOL) == 4000
POOL_ARR = np.frombuffer(b"".join(POOL), dtype=np.uint8).reshape(-1, 16)


def batch(seed: int, n: int, delete_share: float, max_value: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = POOL_ARR[rng.integers(0, len(POOL), n)]
    values = rng.integers(0, max_value, n, endpoint=True, dtype=np.int64)
    values[rng.random(n) < delete_share] = -1
    return keys, values


def replay(model: dict[bytes, int], keys: np.ndarray, values: np.ndarray) -> None:
    for k, v in zip(keys.view("V16").ravel().tolist(), values.tolist(), strict=True):
        if v < 0:
            model.pop(bytes(k), None)
        else:
            model[bytes(k)] = v


# --------------------------------------------------------------------------- selection


class TestSelection:
    def test_the_c_backend_is_active_unless_pure_is_forced(self) -> None:
        if _backend.FORCE_PURE:
            assert kvstore.BACKEND == "python"
        else:
            require_c()
            assert kvstore.BACKEND == "c"
        assert Store.__mro__[1].__module__ == f"kvstore.{'_speedups' if C_ACTIVE else '_fallback'}"

    def _child_backend(self, pure: bool) -> str:
        env = {k: v for k, v in os.environ.items() if k != "KVSTORE_PURE_PYTHON"}
        if pure:
            env["KVSTORE_PURE_PYTHON"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        out = subprocess.run(
            [sys.executable, "-c", "import kvstore; print(kvstore.BACKEND)"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout.strip()

    def test_the_environment_variable_forces_pure_python(self) -> None:
        assert self._child_backend(pure=True) == "python"

    def test_without_the_variable_a_child_gets_c(self) -> None:
        require_c()
        assert self._child_backend(pure=False) == "c"

    def test_stats_report_the_backend(self, store: kvstore.Store) -> None:
        assert store.stats().backend == kvstore.BACKEND

    def test_constants_agree(self) -> None:
        require_c()
        from kvstore import _speedups  # type: ignore[attr-defined]

        for name in _backend._SHARED:
            assert getattr(_speedups, name) == getattr(_fallback, name), name


# --------------------------------------------------------------------------- the index


class IndexPair(RuleBasedStateMachine):
    """A C HashIndex and its pure twin fed the same operations, against a dict."""

    grows = 0
    shrinks = 0

    @initialize(width=st.sampled_from([1, 6, 8]), capacity=st.sampled_from([0, 0, 2000, 20000]))
    def start(self, width: int, capacity: int) -> None:
        self.c = HashIndex(width, capacity=capacity)
        self.py = PyHashIndex(width, capacity=capacity)
        self.max_value = self.c.max_value
        self.model: dict[bytes, int] = {}
        self.caps = [s.cap for s in self.c._segs]

    @rule(i=st.integers(0, len(POOL) - 1), data=st.data())
    def set(self, i: int, data: st.DataObject) -> None:
        value = data.draw(st.integers(0, self.max_value))
        key = POOL[i]
        assert self.c.set(key, value) is self.py.set(key, value) is (key not in self.model)
        self.model[key] = value

    @rule(i=st.integers(0, len(POOL) - 1))
    def delete(self, i: int) -> None:
        key = POOL[i]
        assert self.c.delete(key) == self.py.delete(key) == self.model.pop(key, -1)

    @rule(
        seed=st.integers(0, 2**32),
        n=st.sampled_from([1, 5, 200, 1023, 1024, 1500, 4000]),
        delete_share=st.sampled_from([0.0, 0.1, 0.6, 1.0]),
    )
    def set_many(self, seed: int, n: int, delete_share: float) -> None:
        keys, values = batch(seed, n, delete_share, self.max_value)
        self.c.set_many(keys, values)
        self.py.set_many(keys, values)
        replay(self.model, keys, values)

    @rule(seed=st.integers(0, 2**32), n=st.sampled_from([1, 100, 1500]), probes=st.booleans())
    def lookup_many(self, seed: int, n: int, probes: bool) -> None:
        rng = np.random.default_rng(seed)
        keys = POOL_ARR[rng.integers(0, len(POOL), n)].copy()
        keys[::3] = rng.integers(0, 256, keys[::3].shape, dtype=np.uint8)  # some absent
        got_c, probes_c = self.c.lookup_many(keys, count_probes=probes)
        got_py, probes_py = self.py.lookup_many(keys, count_probes=probes)
        want = [self.model.get(k.tobytes(), -1) for k in keys]
        assert got_c.tolist() == got_py.tolist() == want
        assert probes_c.tolist() == probes_py.tolist()
        if probes:
            assert probes_c.min() >= 1

    @rule(i=st.integers(0, len(POOL) - 1))
    def lookups(self, i: int) -> None:
        key = POOL[i]
        assert self.c.get(key) == self.py.get(key) == self.model.get(key, -1)
        assert (key in self.c) is (key in self.py) is (key in self.model)

    @rule(seed=st.integers(0, 2**32))
    def random_key(self, seed: int) -> None:
        self.c._rng.seed(seed)
        self.py._rng.seed(seed)
        got_c, got_py = outcome(self.c.random_key), outcome(self.py.random_key)
        assert got_c == got_py
        assert (got_c[0] == "ok") is bool(self.model)
        if self.model:
            assert got_c[1] in self.model

    @rule(min_keys=st.sampled_from([0, 5000]))
    def fit(self, min_keys: int) -> None:
        self.c.fit(min_keys)
        self.py.fit(min_keys)

    @invariant()
    def same_table(self) -> None:
        assert table(self.c) == table(self.py)
        assert len(self.c) == len(self.model)
        caps = [s.cap for s in self.c._segs]
        IndexPair.grows += sum(new > old for new, old in zip(caps, self.caps, strict=True))
        IndexPair.shrinks += sum(new < old for new, old in zip(caps, self.caps, strict=True))
        self.caps = caps


class TestIndexTwins:
    def test_the_machine_sees_tables_grow_and_shrink(self) -> None:
        """The machine's own rules, in a fixed order, reach growth and shrinking: its
        random runs below cannot be vacuous about them (how often a random run reaches
        them is chance, so it is not asserted there)."""
        require_c()
        IndexPair.grows = IndexPair.shrinks = 0
        for width in (1, 6, 8):
            machine = IndexPair()
            machine.start(width=width, capacity=0)
            machine.same_table()
            machine.set_many(seed=7, n=4000, delete_share=0.0)
            machine.same_table()
            machine.lookup_many(seed=8, n=1500, probes=True)
            machine.set_many(seed=7, n=4000, delete_share=1.0)
            machine.same_table()
            machine.fit(min_keys=0)
            machine.same_table()
            machine.teardown()
        assert IndexPair.grows >= 3 and IndexPair.shrinks >= 3, (IndexPair.grows, IndexPair.shrinks)

    def test_random_operations_build_identical_tables(self) -> None:
        require_c()
        run_state_machine_as_test(
            IndexPair,
            settings=settings(
                max_examples=40,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )

    @pytest.mark.parametrize("width", [1, 6, 8])
    def test_every_path_grows_and_shrinks_alike(self, width: int) -> None:
        """Growth by set and set_many, shrinking by delete and set_many, deleted-slot
        reuse, a set_many that deletes absent keys, fit(): one table at every step."""
        require_c()
        c, py = HashIndex(width), PyHashIndex(width)
        maxv = c.max_value

        def both(name: str, *args: Any) -> None:
            assert outcome(getattr(c, name), *args) == outcome(getattr(py, name), *args)
            assert table(c) == table(py), name

        def caps() -> list[int]:
            return [s.cap for s in c._segs]

        before = caps()
        for i in range(3000):  # grows through set, rebuilding segments one by one
            both("set", POOL[i], i % (maxv + 1))
        grown = caps()
        assert all(b > a for a, b in zip(before, grown, strict=True))
        for i in range(0, 300, 3):
            both("delete", POOL[i])
        for i in range(0, 300, 6):  # reuses deleted slots
            both("set", POOL[i], 1)
        for i in range(2950):  # shrinks through delete
            both("delete", POOL[i])
        assert any(b < a for a, b in zip(grown, caps(), strict=True))
        before = caps()
        both("set_many", *batch(7, 20000, 0.3, maxv))  # grows through set_many; duplicates
        grown = caps()
        assert all(b > a for a, b in zip(before, grown, strict=True))
        everything = np.full(len(POOL) + 100, -1, dtype=np.int64)
        more = np.random.default_rng(1).integers(0, 256, (100, 16), dtype=np.uint8)
        both("set_many", np.concatenate([POOL_ARR, more]), everything)  # absent keys too
        assert any(b < a for a, b in zip(grown, caps(), strict=True))  # shrinks
        both("set_many", *batch(9, 900, 0.5, maxv))  # the small-batch path
        both("fit", 0)
        both("fit", 100000)

    @given(
        seed=st.integers(0, 2**32),
        width=st.sampled_from([1, 6, 8]),
        fill=st.floats(0, 0.6),
    )
    @settings(max_examples=60, deadline=None)
    def test_insert_segment_round_for_round(self, seed: int, width: int, fill: float) -> None:
        """One segment holding live, deleted and empty slots, and a batch of distinct
        keys (the contract: set_many drops repeats first) that contest empty slots and
        meet their own live and deleted slots: the same slots after."""
        require_c()
        rng = np.random.default_rng(seed)
        c, py = HashIndex(width), PyHashIndex(width)
        cap = int(rng.choice([127, 131, 257]))
        seg_c, seg_py = _Segment(cap, width), PySegment(cap, width)
        n_fill = int(fill * cap)
        pre = rng.choice(len(POOL), n_fill + cap, replace=False)
        pre_keys = POOL_ARR[pre[:n_fill]]
        pre_vals = rng.integers(-1, 100, n_fill)
        c._insert_segment(seg_c, pre_keys, c.hashes(pre_keys), pre_vals)
        py._insert_segment(seg_py, pre_keys, py.hashes(pre_keys), pre_vals)
        room = max(0, int(0.78 * cap) - seg_c.live - seg_c.deleted)
        m = int(rng.integers(0, room + 1))
        keys = np.concatenate([pre_keys[: m // 2], POOL_ARR[pre[n_fill : n_fill + m - m // 2]]])
        keys = keys[rng.permutation(len(keys))]
        values = rng.integers(-1, 2**40, len(keys)) & (
            np.int64(-1) if width == 8 else np.int64((1 << (8 * width - 1)) - 1)
        )
        values[rng.random(len(keys)) < 0.2] = -1
        c._insert_segment(seg_c, keys, c.hashes(keys), values)
        py._insert_segment(seg_py, keys, py.hashes(keys), values)
        assert (bytes(seg_c.kmv), bytes(seg_c.vmv)) == (bytes(seg_py.kmv), bytes(seg_py.vmv))
        assert (seg_c.live, seg_c.deleted) == (seg_py.live, seg_py.deleted)
        top = width - 1
        assert seg_c.live == int(np.count_nonzero(seg_c.vals[:, top] < 0xFE))

    @given(
        seed=st.integers(0, 2**32),
        n=st.integers(0, 3000),
        pool=st.sampled_from([5, 300, 4000]),
        strided=st.booleans(),
    )
    @settings(max_examples=60, deadline=None)
    def test_group_batch_and_hashes(self, seed: int, n: int, pool: int, strided: bool) -> None:
        """The same groups, in the same order, from the C passes as from the sorts; as
        contiguous arrays and as strided views of KEY records (what an open passes)."""
        require_c()
        rng = np.random.default_rng(seed)
        keys = POOL_ARR[rng.integers(0, pool, n)]
        values = rng.integers(-1, 2**40, n)
        if strided:
            recs = np.empty(n, dtype=fmt.KEY_RECORD_DTYPE)
            recs["key"] = keys.view("V16").reshape(-1)
            recs["off"] = values
            keys, values = fmt.record_key_rows(recs), recs["off"]
            assert not keys.flags.c_contiguous or n < 2
        outs = []
        for impl in (HashIndex, PyHashIndex):
            gk = np.full((n, 16), 7, dtype=np.uint8)
            gh = np.full(n, 7, dtype=np.uint64)
            gv = np.full(n, -7, dtype=np.int64)
            counts = np.full(16, -7, dtype=np.int64)
            m = impl._group_batch(keys, values, gk, gh, gv, counts)
            outs.append((m, gk[:m].tobytes(), gh[:m].tolist(), gv[:m].tolist(), counts.tolist()))
        assert outs[0] == outs[1]
        m, gk_bytes, gh_list, gv_list, counts_list = outs[0]
        last = {k.tobytes(): int(v) for k, v in zip(keys, values, strict=True)}
        assert m == len(last) == sum(counts_list)
        got = [gk_bytes[j * 16 : j * 16 + 16] for j in range(m)]
        assert dict(zip(got, gv_list, strict=True)) == last  # the last value of each key
        assert [h >> 60 for h in gh_list] == sorted(h >> 60 for h in gh_list)
        h_c, h_py = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
        contiguous = np.ascontiguousarray(keys)
        HashIndex._hash_keys(contiguous, h_c)
        PyHashIndex._hash_keys(contiguous, h_py)
        assert h_c.tolist() == h_py.tolist()
        from kvstore._index import hash_key

        assert h_c[:50].tolist() == [hash_key(k.tobytes()) for k in contiguous[:50]]
        assert gh_list[:50] == [hash_key(k) for k in got[:50]]

    def test_values_at_the_limits_of_the_width(self) -> None:
        require_c()
        for width in (1, 6, 8):
            c, py = HashIndex(width), PyHashIndex(width)
            for value in (0, c.max_value, 1 << (8 * width), -1):
                got, want = outcome(c.set, POOL[0], value), outcome(py.set, POOL[0], value)
                assert got[0] == want[0] and (got[0] == "ok" or got[1][0] is want[1][0])
                assert table(c) == table(py)
            assert c.get(POOL[0]) == py.get(POOL[0]) == c.max_value


# --------------------------------------------------------------------------- the store


KEYS = POOL[:40] + [b"\x00" * 16, b"\xff" * 16]


class StorePair(RuleBasedStateMachine):
    """A C Store and its pure twin in two directories, fed the same operations."""

    base: Path

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=self.base))
        self.model: dict[bytes, bytes] = {}
        self.stores: list[Store] = []

    @initialize(buffer_size=st.sampled_from([100, 4096, 1 << 20]))
    def open_both(self, buffer_size: int) -> None:
        self.opts = {"buffer_size": buffer_size}
        self.stores = [
            Store(self.dir / "c", **self.opts),  # type: ignore[arg-type]
            PyStore(self.dir / "py", **self.opts),
        ]

    def teardown(self) -> None:
        for db in self.stores:
            db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def both(self, fn: Callable[[Store], Any]) -> Any:
        got = [outcome(fn, db) for db in self.stores]
        assert got[0] == got[1]
        return got[0]

    @rule(
        i=st.integers(0, len(KEYS) - 1),
        value=st.binary(max_size=30) | st.binary(min_size=2000, max_size=3000),
    )
    def put(self, i: int, value: bytes) -> None:
        self.both(lambda db: db.__setitem__(KEYS[i], value))
        self.model[KEYS[i]] = value

    @rule(i=st.integers(0, len(KEYS) - 1))
    def delete(self, i: int) -> None:
        kind, _ = self.both(lambda db: db.__delitem__(KEYS[i]))
        assert (kind == "ok") is (self.model.pop(KEYS[i], None) is not None)

    @rule(i=st.integers(0, len(KEYS) - 1))
    def read(self, i: int) -> None:
        key = KEYS[i]
        assert self.both(lambda db: key in db) == ("ok", key in self.model)
        assert self.both(lambda db: db.get(key, b"-")) == ("ok", self.model.get(key, b"-"))
        self.both(lambda db: db[key])
        self.both(lambda db: db.get(key=key))

    @rule(seed=st.integers(0, 2**32), n=st.sampled_from([1, 30, 1200]))
    def put_many(self, seed: int, n: int) -> None:
        rng = random.Random(seed)
        keys = [rng.choice(KEYS) for _ in range(n)]
        values = [rng.randbytes(rng.choice([0, 5, 300])) for _ in range(n)]
        self.both(lambda db: db.put_many(keys, values))
        self.model.update(zip(keys, values, strict=True))

    @rule(seed=st.integers(0, 2**32))
    def contains_many(self, seed: int) -> None:
        rng = random.Random(seed)
        keys = [rng.choice(KEYS) for _ in range(50)] + [rng.randbytes(16) for _ in range(10)]
        kind, got = self.both(lambda db: db.contains_many(keys).tolist())
        assert got == [k in self.model for k in keys]

    @rule(seed=st.integers(0, 2**32))
    def random_key(self, seed: int) -> None:
        for db in self.stores:
            db._g.index._rng.seed(seed)
        self.both(lambda db: db.random_key())

    @rule()
    def flush_and_compare_files(self) -> None:
        self.both(lambda db: db.flush())
        assert files_of(self.dir / "c") == files_of(self.dir / "py")

    @rule()
    def reopen(self) -> None:
        for db in self.stores:
            db.close()
        assert files_of(self.dir / "c") == files_of(self.dir / "py")
        self.open_both(self.opts["buffer_size"])

    @invariant()
    def same_index(self) -> None:
        if self.stores:
            c, py = (db._g.index for db in self.stores)
            assert table(c) == table(py)
            assert len(c) == len(self.model)


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name.startswith("data-")}


class TestStoreTwins:
    def test_random_operations_write_identical_files(self, tmp_path: Path) -> None:
        require_c()
        StorePair.base = tmp_path
        run_state_machine_as_test(
            StorePair,
            settings=settings(
                max_examples=25,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


# --------------------------------------------------------------------------- errors


def backends() -> list[Any]:
    """The classes to test behaviour on: the active backend, plus the pure twin under C."""
    c_marks = [] if C_ACTIVE else [pytest.mark.skip(reason=PURE_REASON)]
    return [
        pytest.param((Store, KeySet, KeyIntMap), id=kvstore.BACKEND),
        pytest.param((PyStore, PyKeySet, PyKeyIntMap), id="pure-twin", marks=c_marks),
    ]


BAD_KEYS = [b"x" * 15, b"x" * 17, b"", "a" * 16, 16, None, 1.5, bytearray(15), memoryview(b"x" * 3)]
GOOD_ODD_KEYS = [bytearray(b"k" * 16), memoryview(b"m" * 16)]


def _key_ops(db: Store, ks: KeySet, km: KeyIntMap) -> dict[str, Callable[[Any], Any]]:
    return {
        "store in": lambda k: k in db,
        "store []": lambda k: db[k],
        "store get": lambda k: db.get(k),
        "store put": lambda k: db.__setitem__(k, b"v"),
        "store del": lambda k: db.__delitem__(k),
        "set in": lambda k: k in ks,
        "set add": lambda k: ks.add(k),
        "set discard": lambda k: ks.discard(k),
        "map in": lambda k: k in km,
        "map []": lambda k: km[k],
        "map get": lambda k: km.get(k, -5),
        "map put": lambda k: km.__setitem__(k, 3),
        "map del": lambda k: km.__delitem__(k),
    }


TWINS = [("c", (Store, KeySet, KeyIntMap)), ("py", (PyStore, PyKeySet, PyKeyIntMap))]
STORE_VALUES = ["str", 5, None, b"x" * 11, bytearray(b"ba"), memoryview(b"mv"), b"x" * 10, b""]
MAP_VALUES = [-1, 2**63, 2**63 - 1, 0, True, 1.5, "5", np.int64(5), np.uint8(7), 2**70, -(2**70)]


class TestErrorsMatch:
    def test_invalid_and_odd_keys(self, tmp_path: Path) -> None:
        """Every single-key method, C and pure: the same exception and message for a bad
        key, the same result for a bytearray / memoryview key."""
        require_c()
        runs = []
        for name, classes in TWINS:
            db = classes[0](tmp_path / name)
            ks, km = classes[1](), classes[2]()
            try:
                ops = _key_ops(db, ks, km)
                keys = BAD_KEYS + GOOD_ODD_KEYS
                runs.append(
                    {(op, j): outcome(f, k) for op, f in ops.items() for j, k in enumerate(keys)}
                )
            finally:
                db.close()
        assert runs[0] == runs[1]
        bad = [got for (_, j), got in runs[0].items() if j < len(BAD_KEYS)]
        assert all(got[0] == "raise" and got[1][0] is InvalidKeyError for got in bad)

    def test_invalid_values(self, tmp_path: Path) -> None:
        require_c()
        runs = []
        for name, classes in TWINS:
            db = classes[0](tmp_path / name, max_value_size=10)
            km = classes[2]()
            try:
                got = {}
                for j, value in enumerate(STORE_VALUES):
                    got["store", j] = outcome(db.__setitem__, POOL[0], value)
                    got["store read", j] = outcome(db.get, POOL[0])
                for j, value in enumerate(MAP_VALUES):
                    got["map", j] = outcome(km.__setitem__, POOL[0], value)
                    got["map read", j] = outcome(km.get, POOL[0])
                runs.append(got)
            finally:
                db.close()
        assert runs[0] == runs[1]

    def test_put_many_values(self, tmp_path: Path) -> None:
        """put_many checks each value as a put does, whatever the input's form."""
        require_c()
        runs = []
        for name, classes in TWINS:
            db = classes[0](tmp_path / name, max_value_size=10)
            try:
                got = {}
                for j, value in enumerate(STORE_VALUES):
                    got[j] = outcome(db.put_many, [POOL[1], POOL[2]], [b"ok", value])
                got["tuple"] = outcome(db.put_many, (POOL[3],), (bytearray(b"t"),))
                got["iterator"] = outcome(db.put_many, iter([POOL[4]]), iter([b"i"]))
                got["short"] = outcome(db.put_many, [POOL[5], POOL[6]], [b"x"])
                got["empty"] = outcome(db.put_many, [], [])
                got["items"] = sorted(db.items())
                runs.append(got)
            finally:
                db.close()
        assert runs[0] == runs[1]
        assert files_of(tmp_path / "c") == files_of(tmp_path / "py")

    @pytest.mark.parametrize("classes", backends())
    def test_value_crcs_are_zlibs(self, tmp_path: Path, classes: Any) -> None:
        """The CRC in every VAL record is zlib.crc32 of its length field, key and value,
        for values short or long, from a put or from put_many (FORMAT.md, format 3)."""
        import struct
        import zlib

        lengths = [0, 1, 7, 8, 9, 15, 16, 17, 100, 2047, 2048, 2049, 70000]
        values = [random.Random(n).randbytes(n) for n in lengths]
        with classes[0](tmp_path / "s") as db:
            for i, value in enumerate(values):
                db[POOL[i]] = value
            db.put_many(POOL[100 : 100 + len(values)], values)
            del db[POOL[0]]
        data = next((tmp_path / "s").glob("data-*.val")).read_bytes()
        pos, seen = 24, []
        while pos < len(data):
            length, crc = struct.unpack_from("<II", data, pos)
            key = data[pos + 8 : pos + 24]
            size = 0 if length == 0xFFFF_FFFF else length
            seen.append((key, data[pos + 24 : pos + 24 + size], crc))
            pos += 24 + size

        def crc(length: int, key: bytes, value: bytes) -> int:
            return zlib.crc32(value, zlib.crc32(key, zlib.crc32(struct.pack("<I", length))))

        keys = POOL[: len(values)] + POOL[100 : 100 + len(values)]
        want = [(key, v, crc(len(v), key, v)) for key, v in zip(keys, values + values, strict=True)]
        assert seen == want + [(POOL[0], b"", crc(0xFFFF_FFFF, POOL[0], b""))]

    @pytest.mark.parametrize("classes", backends())
    def test_crc_failure_on_every_read_path(self, tmp_path: Path, classes: Any) -> None:
        """A flipped value byte raises CorruptStoreError whether the value is read from
        the write buffer, the map, or by pread past the map; intact values read back."""
        store_cls = classes[0]
        path = tmp_path / "s"
        with store_cls(path) as db:
            for i in range(3):
                db[POOL[i]] = b"value %d" % i
        val_file = next(path.glob("data-*.val"))
        off = 24 + 24  # the first value's first byte
        data = bytearray(val_file.read_bytes())
        data[off] ^= 0x01
        val_file.write_bytes(bytes(data))
        # tail_check_bytes=1: the open CRC-checks only the last record, so the damaged
        # first one stays in the store for a read to find.
        db = store_cls(path, tail_check_bytes=1)
        try:
            with pytest.raises(CorruptStoreError):  # in the map
                db[POOL[0]]
            with pytest.raises(CorruptStoreError):
                db.get(POOL[0])
            assert db[POOL[1]] == b"value 1"
            db[POOL[3]] = b"in the buffer"
            buf = db._g.wbuf[1]
            buf[24] ^= 0x01
            with pytest.raises(CorruptStoreError):  # in the write buffer
                db[POOL[3]]
            buf[24] ^= 0x01
            assert db[POOL[3]] == b"in the buffer"
            db.flush()  # now past the mapped length: read with pread
            assert db._g.files.mm[1] < db._g.wbuf[0]
            assert db[POOL[3]] == b"in the buffer"
            where = db._g.index.get(POOL[3]) + 24
            fd = os.open(val_file, os.O_WRONLY)
            try:
                os.pwrite(fd, b"X", where)
            finally:
                os.close(fd)
            with pytest.raises(CorruptStoreError):
                db[POOL[3]]
        finally:
            db.abandon()

    @pytest.mark.parametrize("classes", backends())
    def test_another_keys_record_on_every_read_path(self, tmp_path: Path, classes: Any) -> None:
        """An index entry that leads to another key's record (a damaged KEY offset),
        intact and CRC-valid, raises CorruptStoreError naming both keys, whether the
        record is in the write buffer, the map, or read by pread past the map."""
        store_cls = classes[0]
        path = tmp_path / "s"
        with store_cls(path) as db:
            db[POOL[0]] = b"mapped 0"
            db[POOL[1]] = b"mapped 1"
        db = store_cls(path)
        try:
            index = db._g.index
            index.set(POOL[0], index.get(POOL[1]))  # what a flipped offset bit does
            for read in (lambda: db[POOL[0]], lambda: db.get(POOL[0])):
                with pytest.raises(CorruptStoreError, match=POOL[1].hex()):  # in the map
                    read()
            assert db[POOL[1]] == b"mapped 1"
            db[POOL[2]] = b"buffered 2"
            db[POOL[3]] = b"buffered 3"
            index.set(POOL[2], index.get(POOL[3]))
            with pytest.raises(CorruptStoreError, match=POOL[3].hex()):  # in the buffer
                db[POOL[2]]
            db.flush()  # past the mapped length: read with pread
            assert db._g.files.mm[1] < db._g.wbuf[0]
            with pytest.raises(CorruptStoreError, match=POOL[3].hex()):
                db[POOL[2]]
            del db[POOL[3]]  # its deletion record lies in the buffer now
            deletion = db._g.wbuf[0] + len(db._g.wbuf[1]) - 24
            index.set(POOL[1], deletion)
            with pytest.raises(CorruptStoreError, match="deletion"):
                db[POOL[1]]
        finally:
            db.abandon()

    @pytest.mark.parametrize("classes", backends())
    def test_reads_from_buffer_and_map_need_no_python_under_c(
        self, tmp_path: Path, classes: Any
    ) -> None:
        """C reads a buffered or mapped value itself and hands only the pread case to
        Store._read; the pure code calls _read every time."""
        calls: list[int] = []

        class Counting(classes[0]):  # type: ignore[misc, valid-type]
            def _read(self, g: Any, off: int, key: bytes) -> bytes:
                calls.append(off)
                return super()._read(g, off, key)

        path = tmp_path / "s"
        with Counting(path) as db:
            db[POOL[0]] = b"mapped after reopen"
        with Counting(path) as db:
            db[POOL[1]] = b"buffered"
            assert db[POOL[0]] == b"mapped after reopen"
            assert db.get(POOL[1]) == b"buffered"
            db.flush()
            assert db[POOL[1]] == b"buffered"  # pread: past the map
        fast = classes[0] is Store and C_ACTIVE
        assert len(calls) == (1 if fast else 3)

    @pytest.mark.parametrize("classes", backends())
    def test_closed_and_readonly(self, tmp_path: Path, classes: Any) -> None:
        store_cls = classes[0]
        path = tmp_path / "s"
        db = store_cls(path)
        db[POOL[0]] = b"x"
        db.close()
        for fn in (
            lambda: POOL[0] in db,
            lambda: db[POOL[0]],
            lambda: db.get(POOL[0]),
            lambda: db.__setitem__(POOL[1], b"y"),
            lambda: db.__delitem__(POOL[0]),
        ):
            with pytest.raises(StoreClosedError):
                fn()
        with pytest.raises(StoreClosedError):  # the key is checked first, then the store
            db.get(bytearray(POOL[0]))
        ro = store_cls(path, readonly=True)
        try:
            assert POOL[0] in ro and ro[POOL[0]] == b"x" and ro.get(POOL[1]) is None
            with pytest.raises(ReadOnlyError):
                ro[POOL[1]] = b"y"
            with pytest.raises(ReadOnlyError):
                del ro[POOL[0]]
            assert dict(ro.items()) == {POOL[0]: b"x"}
        finally:
            ro.close()

    @pytest.mark.parametrize("classes", backends())
    def test_get_arguments(self, tmp_path: Path, classes: Any) -> None:
        db = classes[0](tmp_path / "s")
        km = classes[2]()
        try:
            for obj in (db, km):
                assert obj.get(POOL[0]) is None
                assert obj.get(POOL[0], 5) == 5
                assert obj.get(POOL[0], default=6) == 6
                assert obj.get(key=POOL[0]) is None
                with pytest.raises(TypeError):
                    obj.get()
                with pytest.raises(TypeError):
                    obj.get(POOL[0], 1, 2)
                with pytest.raises(TypeError):
                    obj.get(POOL[0], dflt=1)
        finally:
            db.close()


# --------------------------------------------------------------------------- threads


class CountingLock:
    """A lock that counts how often it is taken (by acquire() or by `with`)."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.taken = 0

    def acquire(self, *args: Any) -> bool:
        got = self.inner.acquire(*args)
        self.taken += got
        return got

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class TestThreads:
    @pytest.mark.parametrize("classes", backends())
    def test_writes_take_the_owners_lock_and_reads_do_not(
        self, tmp_path: Path, classes: Any
    ) -> None:
        db, ks, km = classes[0](tmp_path / "s"), classes[1](), classes[2]()
        try:
            for obj in (db, ks, km):
                obj._lock = CountingLock()
            db[POOL[0]] = b"x"
            del db[POOL[0]]
            ks.add(POOL[0])
            ks.discard(POOL[0])
            km[POOL[0]] = 1
            del km[POOL[0]]
            with pytest.raises(KeyError):
                del km[POOL[0]]
            assert [obj._lock.taken for obj in (db, ks, km)] == [2, 2, 3]
            for obj in (db, ks, km):
                assert not obj._lock.inner.locked()
            POOL[1] in db, db.get(POOL[1]), POOL[1] in ks, POOL[1] in km, km.get(POOL[1])  # noqa: B018
            assert [obj._lock.taken for obj in (db, ks, km)] == [2, 2, 3]
        finally:
            db.close()

    @pytest.mark.parametrize("classes", backends())
    def test_a_flush_writing_without_the_gil_excludes_writers(
        self, tmp_path: Path, classes: Any, monkeypatch: pytest.MonkeyPatch, fast_switching: None
    ) -> None:
        """flush() holds the lock while os.write runs with the write buffer exported; a
        put that did not take the lock would resize it then (BufferError) or lose bytes."""
        from kvstore import _datafiles

        real = _datafiles.write_all

        def slow_write_all(fd: int, data: Any) -> None:
            view = memoryview(data)  # exported, as the real write is
            time.sleep(0.0005)  # without the GIL: other threads run now
            real(fd, view)
            view.release()

        monkeypatch.setattr(_datafiles, "write_all", slow_write_all)
        path = tmp_path / "s"
        errors: list[BaseException] = []
        stop = threading.Event()
        db = classes[0](path, buffer_size=1 << 30)

        def flusher() -> None:
            while not stop.is_set():
                db.flush()

        def writer(w: int) -> None:
            try:
                for i in range(400):
                    db[POOL[w * 400 + i]] = b"%d" % i
                    if i % 3 == 0:
                        del db[POOL[w * 400 + i]]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        f = threading.Thread(target=flusher)
        f.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        f.join()
        db.close()
        assert errors == []
        want = {POOL[w * 400 + i]: b"%d" % i for w in range(3) for i in range(400) if i % 3}
        with kvstore.open(path) as again:
            assert dict(again.items()) == want
            assert again.verify() == []

    @pytest.mark.parametrize("classes", backends())
    def test_writers_and_readers_against_the_pure_model(
        self, tmp_path: Path, classes: Any, fast_switching: None
    ) -> None:
        """Writers put, overwrite and delete their own keys while readers look at all of
        them; every value a reader sees is one that was written for that key, and the
        end state is what the same operations give on the pure-Python twin."""
        store_cls, set_cls, map_cls = classes
        db = store_cls(tmp_path / "s", buffer_size=2048)
        ks, km = set_cls(), map_cls()
        n_writers, per = 4, 300
        errors: list[BaseException] = []
        done = threading.Event()

        def ops(w: int) -> Iterator[tuple[str, bytes, int]]:
            rng = random.Random(w)
            for step in range(per * 3):
                key = POOL[w * per + rng.randrange(per)]
                yield ("del" if rng.random() < 0.3 else "put"), key, step

        def apply(target: tuple[Any, Any, Any], op: str, key: bytes, step: int) -> None:
            d, s, m = target
            if op == "put":
                d[key] = key[:4] + b"%d" % step
                s.add(key)
                m[key] = step
            else:
                d.pop(key, None)
                s.discard(key)
                m.pop(key, None)

        def writer(w: int) -> None:
            try:
                for op, key, step in ops(w):
                    apply((db, ks, km), op, key, step)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def reader(r: int) -> None:
            rng = random.Random(100 + r)
            try:
                while not done.is_set():
                    key = POOL[rng.randrange(n_writers * per)]
                    value = db.get(key)
                    assert value is None or value[:4] == key[:4]
                    _ = key in ks, key in db
                    assert km.get(key, 0) >= 0
                    if rng.random() < 0.01:
                        db.contains_many([key] * 50)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(n_writers)]
        readers = [threading.Thread(target=reader, args=(r,)) for r in range(3)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join()
        done.set()
        for t in readers:
            t.join()
        assert errors == []

        model_db = PyStore(tmp_path / "model")
        model = (model_db, PyKeySet(), PyKeyIntMap())
        try:
            for w in range(n_writers):
                for op, key, step in ops(w):
                    apply(model, op, key, step)
            assert dict(db.items()) == dict(model_db.items())
            assert set(ks) == set(model[1])
            assert dict(km.items()) == dict(model[2].items())
            assert db.verify() == []
        finally:
            model_db.close()
            db.close()


# --------------------------------------------------------------------------- C guards


class TestCGuards:
    """The C code checks what it is given: a broken table or argument raises, never
    reads or writes out of bounds and never hangs holding the GIL."""

    def test_broken_segments_raise(self) -> None:
        require_c()
        index = HashIndex(6)
        index._segs = index._segs[:3]
        with pytest.raises(RuntimeError):
            POOL[0] in index  # noqa: B015
        index = HashIndex(6)
        seg = index._segs[int(index.hashes(POOL_ARR[:1])[0] >> np.uint64(60))]
        seg.cap = seg.cap * 2  # more slots than the arrays hold
        for fn in (lambda: index.get(POOL[0]), lambda: index.set(POOL[0], 1)):
            with pytest.raises(RuntimeError):
                fn()
        index = HashIndex(6)
        index._segs[0] = PySegment(127, 6)
        with pytest.raises(TypeError):
            index.lookup_many(POOL_ARR)

    def test_a_full_segment_raises_instead_of_hanging(self) -> None:
        require_c()
        index = HashIndex(6)
        for seg in index._segs:
            seg.vals[:] = np.frombuffer(index._deleted, dtype=np.uint8)  # no EMPTY slot
        for fn in (
            lambda: index.get(POOL[0]),
            lambda: index.delete(POOL[0]),
            lambda: index.lookup_many(POOL_ARR[:10]),
        ):
            with pytest.raises(RuntimeError, match="no EMPTY slot"):
                fn()

    def test_bad_buffers_raise(self) -> None:
        require_c()
        index = HashIndex(6)
        keys = POOL_ARR[:10].copy()
        with pytest.raises(ValueError):
            index._lookup_into(keys, np.full(9, -1, dtype=np.int64), None)
        with pytest.raises(ValueError):
            index._lookup_into(keys, np.full(10, -1, dtype=np.int32), None)
        with pytest.raises((ValueError, BufferError)):
            index._lookup_into(keys[::2], np.full(5, -1, dtype=np.int64), None)
        with pytest.raises((ValueError, BufferError, TypeError)):
            index._lookup_into(keys, np.full(10, -1, dtype=np.int64).view(), np.zeros(3))
        with pytest.raises(ValueError):
            index._insert_segment(
                index._segs[0], keys, np.zeros(9, np.uint64), np.zeros(10, np.int64)
            )
        grouped = (np.empty((10, 16), np.uint8), np.empty(10, np.uint64), np.empty(10, np.int64))
        with pytest.raises(ValueError):
            HashIndex._group_batch(keys, np.zeros(9, np.int64), *grouped, np.zeros(16, np.int64))
        with pytest.raises(ValueError):
            HashIndex._group_batch(keys, np.zeros(10, np.int64), *grouped, np.zeros(15, np.int64))
        with pytest.raises(ValueError):
            HashIndex._group_batch(keys[:, :8], np.zeros(10, np.int64), *grouped, np.zeros(16))
        with pytest.raises(TypeError):
            index.get("not bytes")
        assert index.get(b"short") == -1 and b"short" not in index
