"""PendSet (crawler.state.pendset): a set of URL digests at 9 bytes a URL, exact but
for fingerprint collisions, against a Python set doing the same operations."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.state import pendset
from crawler.state.pendset import PendSet

POOL = [bytes([i]) * 8 + bytes([255 - i]) * 8 for i in range(40)]


def rows(keys: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16)


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "discard", "add_many", "discard_many"]),
        st.lists(st.sampled_from(POOL), min_size=1, max_size=6),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(initial=st.lists(st.sampled_from(POOL), max_size=30), steps=ops, merge_at=st.integers(1, 8))
def test_every_answer_is_a_python_sets(initial: list[bytes], steps: list, merge_at: int) -> None:
    """Whatever the order of adds (one or a batch, again after a discard) and discards,
    across merges of the recent fingerprints into the array and its compactions."""
    saved = pendset.MERGE_AT
    pendset.MERGE_AT = merge_at
    try:
        s = PendSet(rows(initial)) if initial else PendSet()
        model = set(initial)
        for op, keys in steps:
            if op == "add":
                s.add(keys[0])
                model.add(keys[0])
            elif op == "discard":
                s.discard(keys[0])
                model.discard(keys[0])
            elif op == "add_many":
                s.add_many(rows(keys))
                model.update(keys)
            else:
                s.discard_many(rows(keys))
                model.difference_update(keys)
            assert len(s) == len(model)
        assert [k in s for k in POOL] == [k in model for k in POOL]
        assert s.contains_many(rows(POOL)).tolist() == [k in model for k in POOL]
    finally:
        pendset.MERGE_AT = saved


def test_a_url_is_its_digests_first_8_bytes() -> None:
    """Two digests alike in their first 8 bytes are one URL (the documented collision,
    probability n / 2**64); the other 8 bytes are not kept."""
    a = bytes(range(16))
    b = bytes(range(8)) + bytes(8)
    s = PendSet(rows([a]))
    assert b in s and s.contains_many(rows([b])).tolist() == [True]
    s.discard(b)
    assert a not in s and len(s) == 0
    assert s.nbytes() == 9  # one fingerprint and its gone byte


def test_a_big_set_costs_9_bytes_a_url() -> None:
    keys = np.random.default_rng(5).integers(0, 256, size=(200_000, 16), dtype=np.uint8)
    s = PendSet(keys)
    assert len(s) == 200_000 and s.nbytes() == 9 * 200_000
    assert s.contains_many(keys).all()
    other = np.random.default_rng(6).integers(0, 256, size=(10_000, 16), dtype=np.uint8)
    assert not s.contains_many(other).any()
    s.add_many(other)
    assert len(s) == 210_000 and s.contains_many(other).all()


def test_claims_discarding_while_the_committer_adds_lose_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers discard (their claims) while the committer adds batches that merge: the
    end state is exactly the model's, every discard and add kept."""
    monkeypatch.setattr(pendset, "MERGE_AT", 64)
    rng = np.random.default_rng(7)
    first = rng.integers(0, 256, size=(20_000, 16), dtype=np.uint8)
    later = rng.integers(0, 256, size=(20_000, 16), dtype=np.uint8)
    s = PendSet(first)
    parts = np.array_split(first, 4)

    def claims(part: np.ndarray) -> None:
        for row in part:
            s.discard(row.tobytes())

    workers = [threading.Thread(target=claims, args=(p,)) for p in parts]
    for w in workers:
        w.start()
    for batch in np.array_split(later, 200):
        s.add_many(batch)
    for w in workers:
        w.join()
    assert len(s) == 20_000
    assert not s.contains_many(first).any() and s.contains_many(later).all()


def test_a_batch_may_name_a_url_twice() -> None:
    s = PendSet(rows([POOL[0], POOL[0], POOL[1]]))
    assert len(s) == 2
    s.add(POOL[2])
    s.discard_many(rows([POOL[2], POOL[2], POOL[0], POOL[0]]))
    assert len(s) == 1 and POOL[1] in s
    s.add_many(rows([POOL[3], POOL[3], POOL[0], POOL[0]]))
    assert len(s) == 3 and s.contains_many(rows(POOL[:4])).tolist() == [True, True, False, True]
