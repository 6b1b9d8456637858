"""The Store against a plain dict: every operation, in any order, across reopen and compaction."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import kvstore

# A small key pool, so overwrites, deletes and duplicate batch keys happen often;
# counters and all-zero / all-0xFF keys next to md5 digests.
KEYS = [kvstore.md5_key(str(i)) for i in range(10)] + [
    b"\x00" * 16,
    b"\xff" * 16,
    (1).to_bytes(16, "big"),
    (1).to_bytes(16, "little"),
    (2).to_bytes(16, "big"),
    b"\x00" * 15 + b"\xfe",
]
keys_st = st.sampled_from(KEYS)
values_st = st.binary(max_size=40) | st.binary(min_size=500, max_size=3000)
FORMS = ["list", "uint8", "V16", "S16"]


def as_form(keys: list[bytes], form: str) -> Any:
    if form == "list":
        return list(keys)
    raw = b"".join(keys)
    if form == "uint8":
        return np.frombuffer(raw, dtype=np.uint8).reshape(-1, 16).copy()
    return np.frombuffer(raw, dtype=form).copy()


class StoreMachine(RuleBasedStateMachine):
    """Drive one store and a dict with the same operations; they must always agree."""

    base: Path  # set by the test: a fresh directory per run of the whole test

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(dir=self.base))
        self.path = self.dir / "store"
        self.model: dict[bytes, bytes] = {}
        self.opts: dict[str, int] = {}
        self.db: kvstore.Store | None = None
        self.last: bytes | None = None  # the key written last

    @initialize(buffer_size=st.sampled_from([None, None, 4096, 100]))
    def open_store(self, buffer_size: int | None) -> None:
        self.opts = {} if buffer_size is None else {"buffer_size": buffer_size}
        self.db = kvstore.open(self.path, **self.opts)

    def teardown(self) -> None:
        if self.db is not None:
            self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def store(self) -> kvstore.Store:
        assert self.db is not None
        return self.db

    @rule(key=keys_st, value=values_st)
    def put(self, key: bytes, value: bytes) -> None:
        self.store[key] = value
        self.model[key] = value
        self.last = key

    @rule(key=keys_st)
    def get(self, key: bytes) -> None:
        if key in self.model:
            assert self.store[key] == self.model[key]
        else:
            with pytest.raises(KeyError):
                self.store[key]

    @rule(key=keys_st)
    def delete(self, key: bytes) -> None:
        if key in self.model:
            del self.store[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.store[key]

    @rule(key=keys_st)
    def contains(self, key: bytes) -> None:
        assert (key in self.store) == (key in self.model)

    @rule()
    def random_key(self) -> None:
        if self.model:
            assert self.store.random_key() in self.model
        else:
            with pytest.raises(KeyError):
                self.store.random_key()

    @rule(
        pairs=st.lists(st.tuples(keys_st, st.binary(max_size=30)), max_size=80),
        form=st.sampled_from(FORMS),
    )
    def put_many(self, pairs: list[tuple[bytes, bytes]], form: str) -> None:
        keys = [p[0] for p in pairs]
        self.store.put_many(as_form(keys, form), [p[1] for p in pairs])
        self.model.update(pairs)
        if keys:
            self.last = keys[-1]

    @rule(keys=st.lists(keys_st, max_size=80), form=st.sampled_from(FORMS))
    def contains_many(self, keys: list[bytes], form: str) -> None:
        got = self.store.contains_many(as_form(keys, form))
        assert got.tolist() == [key in self.model for key in keys]

    @rule(fsync=st.booleans())
    def flush(self, fsync: bool) -> None:
        if fsync:
            self.store.sync()
        else:
            self.store.flush()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.db = kvstore.open(self.path, **self.opts)

    @rule()
    def compact(self) -> None:
        self.store.compact()
        assert self.store.stats().dead_bytes == 0

    @rule()
    def readonly_beside_writer(self) -> None:
        self.store.flush()
        with kvstore.open(self.path, readonly=True) as ro:
            assert len(ro) == len(self.model)
            assert {key: ro[key] for key in ro} == self.model

    @precondition(lambda self: self.db is not None)
    @rule()
    def iterate_and_check_all(self) -> None:
        listed = list(self.store)
        assert len(listed) == len(set(listed))
        assert set(listed) == set(self.model)
        assert {key: self.store[key] for key in listed} == self.model

    @rule()
    def stats(self) -> None:
        # stats() flushes, so it is a rule, not an invariant: most steps must leave
        # writes in the buffer, where reads have to find them too.
        st_ = self.store.stats()
        assert st_.live_keys == len(self.model)
        assert st_.records >= len(self.model)

    @precondition(lambda self: self.db is not None)
    @invariant()
    def same_length_and_last_write(self) -> None:
        assert len(self.store) == len(self.model)
        # Read back the latest write at once, often while it is still buffered.
        if self.last is not None and self.last in self.model:
            assert self.store[self.last] == self.model[self.last]


def test_store_matches_dict_model(tmp_path: Path) -> None:
    class Machine(StoreMachine):
        base = tmp_path

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
