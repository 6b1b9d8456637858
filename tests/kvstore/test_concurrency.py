"""Many threads on one store, a second writer refused, read-only opens beside a live writer."""

from __future__ import annotations

import json
import random
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kvstore
from kvstore.exceptions import ReadOnlyError, StoreLockedError

THREADS = 8
KEYS_PER_THREAD = 150
OPS_PER_THREAD = 1500
COMPACTIONS = 4


def tkey(t: int, j: int) -> bytes:
    return kvstore.md5_key(f"t{t}-{j}")


PINNED = kvstore.md5_key("pinned")
ALL_KEYS = {tkey(t, j) for t in range(THREADS) for j in range(KEYS_PER_THREAD)} | {PINNED}


def run_threads(targets: list[Callable[[], None]]) -> None:
    """Start all targets at once; re-raise the first failure of any of them."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=240)
        assert not th.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


def worker(
    db: kvstore.Store, t: int, model: dict[bytes, bytes], done: threading.Event
) -> Callable[[], None]:
    """A thread owning keys tkey(t, *): its model is exact whatever the other threads do."""

    def run() -> None:
        rng = random.Random(1000 + t)
        mine = [tkey(t, j) for j in range(KEYS_PER_THREAD)]
        for step in range(OPS_PER_THREAD):
            key = rng.choice(mine)
            op = rng.random()
            if op < 0.30:
                value = rng.randbytes(rng.choice((0, 5, 60, 700)))
                db[key] = value
                model[key] = value
            elif op < 0.50:
                if key in model:
                    assert db[key] == model[key], (t, step)
                else:
                    with pytest.raises(KeyError):
                        db[key]
            elif op < 0.60:
                if key in model:
                    del db[key]
                    del model[key]
                else:
                    with pytest.raises(KeyError):
                        del db[key]
            elif op < 0.68:
                assert (key in db) == (key in model)
            elif op < 0.71:
                batch = rng.sample(mine, 60) + rng.sample(mine, 5)  # vectorized path, duplicates
                values = [rng.randbytes(rng.randrange(40)) for _ in batch]
                db.put_many(batch, values)
                model.update(zip(batch, values, strict=True))
            elif op < 0.74:
                got = db.contains_many(mine)
                assert got.tolist() == [k in model for k in mine], (t, step)
            elif op < 0.82:
                assert db.random_key() in ALL_KEYS  # shared: some thread's key
            elif op < 0.90:
                assert 0 <= len(db) <= len(ALL_KEYS)
            elif op < 0.93:
                listed = list(db)
                assert len(listed) == len(set(listed))
                assert set(listed) <= ALL_KEYS
            elif op < 0.94:
                everyone = np.frombuffer(b"".join(sorted(ALL_KEYS)), dtype=np.uint8).reshape(-1, 16)
                assert db.contains_many(everyone).shape == (len(ALL_KEYS),)
            elif op < 0.98:
                db.flush()
            else:
                db.get(key)
        done.set()

    return run


def test_eight_threads_mixing_all_operations(store_path: Path) -> None:
    models: list[dict[bytes, bytes]] = [{} for _ in range(THREADS)]
    dones = [threading.Event() for _ in range(THREADS)]
    compactions = [0]
    with kvstore.open(store_path, buffer_size=4096) as db:
        # A key no thread deletes, so random_key always has something to return.
        db[PINNED] = b"pinned"

        def compactor() -> None:
            for _ in range(COMPACTIONS):
                db.compact()
                compactions[0] += 1
                if all(d.is_set() for d in dones):
                    break
                dones[0].wait(0.02)  # a pause, so the workers run between compactions

        targets = [worker(db, t, models[t], dones[t]) for t in range(THREADS)] + [compactor]
        run_threads(targets)
        assert compactions[0] >= 1
        merged = {k: v for m in models for k, v in m.items()} | {PINNED: b"pinned"}
        assert len(db) == len(merged)
        assert set(db) == set(merged)
        assert all(db[k] == v for k, v in merged.items())
        assert db.verify() == []
    with kvstore.open(store_path) as db:
        assert len(db) == len(merged)
        assert {k: db[k] for k in db} == merged
        assert db.verify() == []


def test_readers_see_every_record_during_compaction(store_path: Path) -> None:
    """Keys written before compaction starts stay readable throughout it, from other threads."""
    fixed = {kvstore.md5_key(f"f{i}"): bytes([i % 256]) * (i % 3000) for i in range(1500)}
    stop = threading.Event()
    count = [0]
    with kvstore.open(store_path) as db:
        db.put_many(list(fixed), list(fixed.values()))

        def reader(seed: int) -> Callable[[], None]:
            def run() -> None:
                rng = random.Random(seed)
                keys = list(fixed)
                while not stop.is_set():
                    key = rng.choice(keys)
                    assert db[key] == fixed[key]
                    assert key in db

            return run

        def writer() -> None:
            while not stop.is_set():
                i = count[0]
                db[kvstore.md5_key(f"w{i}")] = b"w%d" % i
                count[0] = i + 1

        def compactor() -> None:
            try:
                for c in range(3):
                    while count[0] < 1000 * (
                        c + 1
                    ):  # writes land before and during each compaction
                        stop.wait(0.001)
                    db.compact()
            finally:
                stop.set()

        run_threads([reader(1), reader(2), writer, compactor])
        n = count[0]
        written = [kvstore.md5_key(f"w{i}") for i in range(n)]
        assert db.contains_many(written).all()  # nothing written during compaction was lost
        assert all(db[written[i]] == b"w%d" % i for i in range(n))
        assert all(db[k] == v for k, v in fixed.items())
    with kvstore.open(store_path) as db:
        assert len(db) == len(fixed) + n


LOCK_CHILD = """
import sys, kvstore
from kvstore.exceptions import StoreLockedError
try:
    kvstore.open(sys.argv[1]).close()
except StoreLockedError:
    print("locked")
else:
    print("opened")
"""


def try_second_writer(python: str, env: dict[str, str], path: Path) -> str:
    out = subprocess.run(
        [python, "-c", LOCK_CHILD, str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class TestWriterLock:
    def test_second_process_is_refused(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        with kvstore.open(store_path) as db:
            db[tkey(0, 0)] = b"x"
            assert try_second_writer(python, child_env, store_path) == "locked"
            db[tkey(0, 1)] = b"still writable"
        assert try_second_writer(python, child_env, store_path) == "opened"
        with kvstore.open(store_path) as db:
            assert db[tkey(0, 1)] == b"still writable"

    def test_second_writer_in_the_same_process_is_refused(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        with kvstore.open(store_path) as db:
            with pytest.raises(StoreLockedError) as info:
                kvstore.open(store_path)
            assert Path(info.value.path).resolve() == store_path.resolve()
            with pytest.raises(StoreLockedError):
                kvstore.open(store_path)
            # The refused open must not have released the first writer's lock.
            assert try_second_writer(python, child_env, store_path) == "locked"
            db[tkey(0, 0)] = b"x"
        with kvstore.open(store_path) as db:
            assert db[tkey(0, 0)] == b"x"

    def test_readonly_open_beside_writer_in_process(self, store_path: Path) -> None:
        with kvstore.open(store_path) as db:
            db[tkey(0, 0)] = b"x"
            db.flush()
            with kvstore.open(store_path, readonly=True) as ro:
                assert ro[tkey(0, 0)] == b"x"
                with pytest.raises(ReadOnlyError):
                    ro[tkey(0, 1)] = b"y"
                with pytest.raises(ReadOnlyError):
                    del ro[tkey(0, 0)]
                with pytest.raises(ReadOnlyError):
                    ro.put_many([tkey(0, 2)], [b"z"])
                with pytest.raises(ReadOnlyError):
                    ro.compact()
            db[tkey(0, 1)] = b"y"
        with kvstore.open(store_path) as db:
            assert dict(db.items()) == {tkey(0, 0): b"x", tkey(0, 1): b"y"}


READER_CHILD = """
import hashlib, json, sys, kvstore
from kvstore.exceptions import ReadOnlyError
with kvstore.open(sys.argv[1], readonly=True) as ro:
    out = {"items": {k.hex(): hashlib.md5(ro[k]).hexdigest() for k in ro}, "len": len(ro)}
    try:
        ro[b"x" * 16] = b"y"
        out["write"] = "accepted"
    except ReadOnlyError:
        out["write"] = "ReadOnlyError"
    try:
        ro.compact()
        out["compact"] = "accepted"
    except ReadOnlyError:
        out["compact"] = "ReadOnlyError"
print(json.dumps(out))
"""


def read_in_child(python: str, env: dict[str, str], path: Path) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", READER_CHILD, str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def digests(model: dict[bytes, bytes]) -> dict[str, str]:
    import hashlib

    return {k.hex(): hashlib.md5(v).hexdigest() for k, v in model.items()}


class TestReadonlyBesideWriter:
    def test_reader_process_sees_flushed_not_unflushed(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        flushed = {tkey(1, j): (b"v%d" % j) * j for j in range(200)}
        with kvstore.open(store_path, buffer_size=64 << 20) as db:
            db.put_many(list(flushed), list(flushed.values()))
            del db[tkey(1, 0)]
            del flushed[tkey(1, 0)]
            db.flush()
            # Unflushed: new keys, an overwrite, a delete. The reader must see none of them.
            for j in range(200, 260):
                db[tkey(1, j)] = b"unflushed"
            db[tkey(1, 5)] = b"overwritten, unflushed"
            del db[tkey(1, 6)]
            seen = read_in_child(python, child_env, store_path)
            assert seen["items"] == digests(flushed)
            assert seen["len"] == len(flushed)
            assert seen["write"] == "ReadOnlyError"
            assert seen["compact"] == "ReadOnlyError"
            db.flush()
            now = dict(flushed)
            now.update({tkey(1, j): b"unflushed" for j in range(200, 260)})
            now[tkey(1, 5)] = b"overwritten, unflushed"
            del now[tkey(1, 6)]
            assert read_in_child(python, child_env, store_path)["items"] == digests(now)
            # The writer keeps working while readers come and go.
            db[tkey(1, 999)] = b"last"
        now[tkey(1, 999)] = b"last"
        assert read_in_child(python, child_env, store_path)["items"] == digests(now)

    def test_reader_beside_a_compacting_writer(
        self, store_path: Path, python: str, child_env: dict[str, str]
    ) -> None:
        model = {tkey(2, j): bytes([j % 256]) * (j * 13 % 2000) for j in range(400)}
        with kvstore.open(store_path) as db:
            db.put_many(list(model), list(model.values()))
            for j in range(0, 400, 2):
                del db[tkey(2, j)]
                del model[tkey(2, j)]
            db.compact()
            db[tkey(2, 1000)] = b"after compaction"
            model[tkey(2, 1000)] = b"after compaction"
            db.flush()
            assert read_in_child(python, child_env, store_path)["items"] == digests(model)

    def test_readonly_snapshot_survives_writer_compaction(self, store_path: Path) -> None:
        """A reader keeps the snapshot it opened, even after the writer compacts the files away."""
        model = {tkey(3, j): b"old%d" % j * 50 for j in range(300)}
        with kvstore.open(store_path) as db:
            db.put_many(list(model), list(model.values()))
            db.flush()
            with kvstore.open(store_path, readonly=True) as ro:
                for j in range(0, 300, 3):
                    db[tkey(3, j)] = b"new"
                for j in range(1, 300, 3):
                    del db[tkey(3, j)]
                db.compact()
                db[tkey(3, 1000)] = b"later"
                db.flush()
                assert len(ro) == len(model)
                assert {k: ro[k] for k in ro} == model
                assert tkey(3, 1000) not in ro
