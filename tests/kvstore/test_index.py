"""KeySet and KeyIntMap (the store's index machinery in memory), and probe lengths at full load."""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, MutableMapping, MutableSet
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import kvstore
from kvstore.exceptions import InvalidKeyError


def k(i: int | str) -> bytes:
    return kvstore.md5_key(str(i))


BAD_KEYS = [b"x" * 15, b"x" * 17, "a" * 16]
STAT_FIELDS = {
    "capacity",
    "live",
    "deleted",
    "load_factor",
    "max_load_factor",
    "mean_probe_length",
    "memory_bytes",
}


class TestKeySet:
    def test_is_a_mutable_set(self) -> None:
        assert isinstance(kvstore.KeySet(), MutableSet)

    def test_add_discard_remove_contains(self) -> None:
        s = kvstore.KeySet()
        s.add(k(1))
        s.add(k(1))
        s.add(k(2))
        assert k(1) in s and k(3) not in s
        assert len(s) == 2
        s.discard(k(3))  # absent: no error
        s.discard(k(1))
        assert k(1) not in s
        with pytest.raises(KeyError):
            s.remove(k(1))
        s.remove(k(2))
        assert len(s) == 0
        assert list(s) == []

    def test_iter_len_and_set_operations(self) -> None:
        s = kvstore.KeySet()
        for i in range(500):
            s.add(k(i))
        for i in range(0, 500, 5):
            s.discard(k(i))
        expect = {k(i) for i in range(500) if i % 5}
        listed = list(s)
        assert len(listed) == len(set(listed)) == len(s) == len(expect)
        assert set(listed) == expect
        assert s == expect  # Set equality through the ABC

    def test_batch_paths(self) -> None:
        s = kvstore.KeySet()
        keys = [k(i) for i in range(3000)]
        s.add_many(keys[:2000])
        s.add_many(np.frombuffer(b"".join(keys[1000:2500]), dtype="V16"))
        got = s.contains_many(np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16))
        assert got.dtype == np.bool_
        assert got.tolist() == [i < 2500 for i in range(3000)]
        assert s.contains_many(keys[:3]).tolist() == [True, True, True]
        assert s.contains_many([]).shape == (0,)
        assert len(s) == 2500
        assert all(key in s for key in keys[:2500])

    @pytest.mark.parametrize("bad", BAD_KEYS, ids=["15b", "17b", "str"])
    def test_invalid_keys(self, bad: Any) -> None:
        s = kvstore.KeySet()
        for op in (
            s.add,
            s.discard,
            s.__contains__,
            lambda x: s.add_many([x]),
            lambda x: s.contains_many([x]),
        ):
            with pytest.raises(InvalidKeyError):
                op(bad)
        assert len(s) == 0

    def test_random_key(self) -> None:
        s = kvstore.KeySet()
        with pytest.raises(KeyError):
            s.random_key()
        keys = [k(i) for i in range(16)]
        s.add_many(keys)
        for i in range(100, 400):  # deleted slots nearby must never be drawn
            s.add(k(i))
            s.discard(k(i))
        drawn = collections.Counter(s.random_key() for _ in range(16000))
        assert set(drawn) == set(keys)
        assert all(600 <= drawn[key] <= 1400 for key in keys), drawn

    def test_index_stats(self) -> None:
        s = kvstore.KeySet(capacity=1000)
        s.add_many([k(i) for i in range(800)])
        s.discard(k(0))
        st_ = s.index_stats()
        assert STAT_FIELDS <= set(st_)
        assert st_["live"] == 799
        assert st_["capacity"] >= 1000
        assert st_["load_factor"] == pytest.approx((st_["live"] + st_["deleted"]) / st_["capacity"])
        assert 0 < st_["max_load_factor"] < 1
        assert st_["mean_probe_length"] >= 1
        assert st_["memory_bytes"] >= st_["capacity"] * 16

    def test_growth_from_empty(self) -> None:
        s = kvstore.KeySet()
        cap0 = s.index_stats()["capacity"]
        keys = np.random.default_rng(5).integers(0, 256, size=(200_000, 16), dtype=np.uint8)
        s.add_many(keys[:100_000])
        for row in keys[100_000:101_000]:
            s.add(row.tobytes())
        s.add_many(keys[101_000:])
        assert len(s) == 200_000
        assert s.contains_many(keys).all()
        other = np.random.default_rng(6).integers(0, 256, size=(50_000, 16), dtype=np.uint8)
        assert not s.contains_many(other).any()
        st_ = s.index_stats()
        assert st_["capacity"] > cap0
        assert st_["load_factor"] <= st_["max_load_factor"]
        assert all(keys[i].tobytes() in s for i in range(0, 200_000, 997))

    def test_churn_keeps_the_table_small(self) -> None:
        """ProcessingSet adds and discards every URL: deleted slots must not pile up forever."""
        s = kvstore.KeySet()
        live: collections.deque[bytes] = collections.deque()
        for i in range(60_000):
            key = i.to_bytes(16, "little")
            s.add(key)
            live.append(key)
            if len(live) > 50:
                s.discard(live.popleft())
        assert len(s) == 50
        assert set(s) == set(live)
        assert (59_000).to_bytes(16, "little") not in s
        st_ = s.index_stats()
        assert st_["capacity"] < 5_000, st_
        # Batches in, singles out, over the same table.
        for start in range(0, 50_000, 1000):
            batch = np.arange(start, start + 1000, dtype="<u8")
            arr = np.zeros((1000, 16), dtype=np.uint8)
            arr[:, 8:] = batch.view(np.uint8).reshape(-1, 8)
            s.add_many(arr)
            assert len(s) == 1050
            for row in arr:
                s.discard(row.tobytes())
        assert set(s) == set(live)
        assert s.index_stats()["capacity"] < 50_000


class TestKeyIntMap:
    def test_is_a_mutable_mapping(self) -> None:
        assert isinstance(kvstore.KeyIntMap(), MutableMapping)

    def test_set_get_delete(self) -> None:
        m = kvstore.KeyIntMap()
        m[k(1)] = 7
        m[k(2)] = 0
        m[k(1)] = 8
        assert m[k(1)] == 8 and m[k(2)] == 0
        assert len(m) == 2
        with pytest.raises(KeyError) as info:
            m[k(3)]
        assert info.value.args == (k(3),)
        with pytest.raises(KeyError):
            del m[k(3)]
        del m[k(1)]
        assert k(1) not in m
        assert dict(m) == {k(2): 0}
        assert m.get(k(1), 5) == 5

    def test_value_bounds(self) -> None:
        m = kvstore.KeyIntMap()
        m[k(1)] = 2**63 - 1
        assert m[k(1)] == 2**63 - 1
        m[k(2)] = 0
        for bad in (-1, 2**63, 2**64):
            with pytest.raises(ValueError):
                m[k(3)] = bad
            with pytest.raises(ValueError):
                m.put_many([k(3)], [bad])
        assert k(3) not in m
        assert m[k(1)] == 2**63 - 1

    @pytest.mark.parametrize("width", [1, 2, 5])
    def test_narrow_values(self, width: int) -> None:
        top = 2 ** (8 * width - 1) - 1
        m = kvstore.KeyIntMap(width=width)
        keys = [k(i) for i in range(3000)]  # past the first growth of the table
        m.put_many(keys, [i % (top + 1) for i in range(3000)])
        m[k(1)] = top
        m[k(2)] = 0
        assert m.get_many(keys).tolist() == [
            top if i == 1 else 0 if i == 2 else i % (top + 1) for i in range(3000)
        ]
        for bad in (-1, top + 1):
            with pytest.raises(ValueError):
                m[k(5)] = bad
            with pytest.raises(ValueError):
                m.put_many([k(5)], [bad])
        assert m[k(5)] == 5 % (top + 1)
        del m[k(1)]
        assert k(1) not in m and len(m) == 2999
        stats = m.index_stats()
        assert stats["memory_bytes"] == stats["capacity"] * (16 + width)

    def test_items_arrays_is_a_snapshot_of_every_entry(self) -> None:
        m = kvstore.KeyIntMap(width=5)
        assert [a.shape for a in m.items_arrays()] == [(0, 16), (0,)]
        m.put_many([k(i) for i in range(5000)], [i * 7 for i in range(5000)])
        for i in range(0, 5000, 2):
            del m[k(i)]
        keys, values = m.items_arrays()
        m[k(1)] = 1  # after the snapshot: not in it
        assert keys.dtype == np.uint8 and values.dtype == np.int64
        got = {keys[j].tobytes(): int(values[j]) for j in range(len(keys))}
        assert got == {k(i): i * 7 for i in range(1, 5000, 2)}
        for lo, hi in ((None, 700), (700, None), (700, 1400), (10**9, None)):
            keys, values = m.items_arrays(lo, hi)
            got = {keys[j].tobytes(): int(values[j]) for j in range(len(keys))}
            assert got == {k(i): i * 7 for i in range(1, 5000, 2) if i != 1
                           and (lo is None or i * 7 >= lo) and (hi is None or i * 7 <= hi)
                           } | ({k(1): 1} if (lo is None) else {})

    @pytest.mark.parametrize("width", [0, 9, 2.0])
    def test_bad_width(self, width: object) -> None:
        with pytest.raises(ValueError, match="width"):
            kvstore.KeyIntMap(width=width)  # type: ignore[arg-type]

    def test_batch_paths(self) -> None:
        m = kvstore.KeyIntMap()
        keys = [k(i) for i in range(2000)]
        m.put_many(keys[:1500], np.arange(1500))
        m.put_many([keys[0], keys[1], keys[0]], [10, 11, 12])  # later duplicates win
        dup_keys = [keys[i % 50] for i in range(500)]
        m.put_many(dup_keys, list(range(500)))
        got = m.get_many(keys)
        assert got.dtype == np.int64
        expect = [450 + i if i < 50 else (i if i < 1500 else -1) for i in range(2000)]
        assert got.tolist() == expect
        assert m.get_many(keys, default=-7).tolist() == [x if x >= 0 else -7 for x in expect]
        assert m.contains_many(keys).tolist() == [x >= 0 for x in expect]
        assert all(m[keys[i]] == expect[i] for i in range(1500))

    @pytest.mark.parametrize("bad", BAD_KEYS, ids=["15b", "17b", "str"])
    def test_invalid_keys(self, bad: Any) -> None:
        m = kvstore.KeyIntMap()
        for op in (
            lambda x: m.__setitem__(x, 1),
            m.__getitem__,
            m.__delitem__,
            m.__contains__,
            lambda x: m.put_many([x], [1]),
            lambda x: m.get_many([x]),
            lambda x: m.contains_many([x]),
        ):
            with pytest.raises(InvalidKeyError):
                op(bad)

    def test_random_key(self) -> None:
        m = kvstore.KeyIntMap()
        with pytest.raises(KeyError):
            m.random_key()
        m.put_many([k(i) for i in range(100)], list(range(100)))
        for i in range(0, 100, 2):
            del m[k(i)]
        drawn = {m.random_key() for _ in range(2000)}
        assert drawn == {k(i) for i in range(1, 100, 2)}


POOL = (
    [k(i) for i in range(300)]
    + [i.to_bytes(16, "big") for i in range(40)]
    + [b"\x00" * 16, b"\xff" * 16]
)
pool_keys = st.sampled_from(POOL)


class IndexMachine(RuleBasedStateMachine):
    """KeySet and KeyIntMap against set and dict, through single and batch paths alike."""

    def __init__(self) -> None:
        super().__init__()
        self.ks = kvstore.KeySet()
        self.km = kvstore.KeyIntMap()
        self.set_model: set[bytes] = set()
        self.map_model: dict[bytes, int] = {}

    @rule(key=pool_keys)
    def add(self, key: bytes) -> None:
        self.ks.add(key)
        self.set_model.add(key)

    @rule(key=pool_keys)
    def discard(self, key: bytes) -> None:
        self.ks.discard(key)
        self.set_model.discard(key)

    @rule(keys=st.lists(pool_keys, max_size=150))
    def add_many(self, keys: list[bytes]) -> None:
        self.ks.add_many(keys)
        self.set_model.update(keys)

    @rule(keys=st.lists(pool_keys, max_size=150))
    def discard_some(self, keys: list[bytes]) -> None:
        for key in keys:
            self.ks.discard(key)
            self.set_model.discard(key)

    @rule(key=pool_keys, value=st.integers(0, 2**63 - 1))
    def put(self, key: bytes, value: int) -> None:
        self.km[key] = value
        self.map_model[key] = value

    @rule(key=pool_keys)
    def delete(self, key: bytes) -> None:
        if key in self.map_model:
            del self.km[key]
            del self.map_model[key]
        else:
            with pytest.raises(KeyError):
                del self.km[key]

    @rule(pairs=st.lists(st.tuples(pool_keys, st.integers(0, 2**63 - 1)), max_size=150))
    def put_many(self, pairs: list[tuple[bytes, int]]) -> None:
        self.km.put_many([p[0] for p in pairs], [p[1] for p in pairs])
        self.map_model.update(pairs)

    @rule(keys=st.lists(pool_keys, max_size=150))
    def lookups(self, keys: list[bytes]) -> None:
        assert self.ks.contains_many(keys).tolist() == [key in self.set_model for key in keys]
        assert self.km.get_many(keys).tolist() == [self.map_model.get(key, -1) for key in keys]
        for key in keys[:10]:
            assert (key in self.ks) == (key in self.set_model)
            assert self.km.get(key) == self.map_model.get(key)

    @rule()
    def random_keys(self) -> None:
        for obj, model in ((self.ks, self.set_model), (self.km, self.map_model)):
            if model:
                assert obj.random_key() in model
            else:
                with pytest.raises(KeyError):
                    obj.random_key()

    @invariant()
    def same_contents(self) -> None:
        assert len(self.ks) == len(self.set_model)
        assert len(self.km) == len(self.map_model)

    @rule()
    def full_check(self) -> None:
        assert set(self.ks) == self.set_model
        assert dict(self.km.items()) == self.map_model
        assert self.ks.index_stats()["live"] == len(self.set_model)


def test_keyset_and_keyintmap_match_models() -> None:
    run_state_machine_as_test(
        IndexMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# --- probe length at the maximum load factor -----------------------------------

HINT = 1 << 19  # keys per structure: large enough that segment imbalance stays under 2%


def md5_keys(n: int) -> np.ndarray:
    raw = b"".join(hashlib.md5(b"%d" % i).digest() for i in range(n))
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, 16)


def counter_keys(n: int, byteorder: str) -> np.ndarray:
    """Row i is i.to_bytes(16, byteorder)."""
    arr = np.zeros((n, 16), dtype=np.uint8)
    if byteorder == "big":
        arr[:, 8:] = np.arange(n, dtype=">u8").view(np.uint8).reshape(-1, 8)
    else:
        arr[:, :8] = np.arange(n, dtype="<u8").view(np.uint8).reshape(-1, 8)
    return arr


_KEY_CACHE: dict[str, np.ndarray] = {}


def keys_of(kind: str, n: int) -> np.ndarray:
    """The first n keys of a kind (md5 digests, or 16-byte big / little endian counters)."""
    if len(_KEY_CACHE.get(kind, ())) < n:
        _KEY_CACHE[kind] = md5_keys(n) if kind == "md5" else counter_keys(n, kind)
    return _KEY_CACHE[kind][:n]


def test_counter_key_layout() -> None:
    assert keys_of("big", 300)[258].tobytes() == (258).to_bytes(16, "big")
    assert keys_of("little", 300)[258].tobytes() == (258).to_bytes(16, "little")


MAX_LOAD = kvstore.KeySet().index_stats()["max_load_factor"]


class Filler:
    """A fresh structure of one kind, filled with a batch; reports index stats."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.n = 0

    def make_and_fill(
        self, keys: np.ndarray | None
    ) -> tuple[dict[str, float], Callable[[np.ndarray], np.ndarray]]:
        if self.kind == "KeySet":
            s = kvstore.KeySet(capacity=HINT)
            if keys is not None:
                s.add_many(keys)
            return s.index_stats(), s.contains_many
        if self.kind == "KeyIntMap":
            m = kvstore.KeyIntMap(capacity=HINT)
            if keys is not None:
                m.put_many(keys, np.arange(len(keys)))
            return m.index_stats(), m.contains_many
        self.n += 1
        with kvstore.open(self.tmp / f"store{self.n}", capacity=HINT) as db:
            if keys is not None:
                db.put_many(keys, [b""] * len(keys))
            s = db.stats()
            stats = {
                "capacity": s.index_capacity,
                "load_factor": s.load_factor,
                "mean_probe_length": s.mean_probe_length,
            }
            found = db.contains_many(keys) if keys is not None else np.zeros(0, dtype=bool)
        return stats, lambda _k: found


@pytest.mark.parametrize("structure", ["KeySet", "KeyIntMap", "Store"])
@pytest.mark.parametrize("kind", ["md5", "big", "little"])
def test_mean_probe_length_at_max_load(tmp_path: Path, structure: str, kind: str) -> None:
    filler = Filler(structure, tmp_path)
    empty, _ = filler.make_and_fill(None)
    cap = empty["capacity"]
    assert cap * MAX_LOAD >= HINT * 0.98, (
        "the capacity hint does not size the index for that many keys"
    )
    # Fill as close to the maximum load as the index allows without growing;
    # every step tried stays within 2% of it.
    for frac in (0.995, 0.99, 0.985, 0.98):
        n = int(frac * MAX_LOAD * cap)
        keys = keys_of(kind, n)
        stats, contains = filler.make_and_fill(keys)
        if stats["capacity"] == cap:
            break
    else:
        pytest.fail(
            f"{structure}/{kind}: the index grew before 98% of its max load factor {MAX_LOAD}"
        )
    assert contains(keys).all()
    assert stats["load_factor"] >= 0.98 * MAX_LOAD
    assert stats["load_factor"] <= MAX_LOAD
    assert stats["mean_probe_length"] < 2, stats


def test_probe_length_of_keys_with_equal_halves() -> None:
    """DESIGN 3.2: 'sequential or adversarial keys' must not form long probe chains.

    Keys whose two 8-byte halves are equal (a counter written twice) are one
    structured pattern; a mixing step that folds the halves together with XOR
    sends all of them to one slot.
    """
    s = kvstore.KeySet()
    s.add_many([i.to_bytes(8, "little") * 2 for i in range(2000)])
    assert len(s) == 2000
    assert s.index_stats()["mean_probe_length"] < 2
