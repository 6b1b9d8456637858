"""Many threads on one store, a second writer refused, read-only opens beside a live writer."""

from __future__ import annotations

import bisect
import itertools
import json
import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import kvstore
from kvstore.exceptions import ReadOnlyError, StoreLockedError

THREADS = 8
KEYS_PER_THREAD = 150
OPS_PER_THREAD = 1500
RACERS = 3
SHARED_KEYS = 6
OPS_PER_RACER = 1500
MIN_COMPACTIONS = 3
MIN_WRITES_INSIDE_COMPACTIONS = 50


def tkey(t: int, j: int) -> bytes:
    return kvstore.md5_key(f"t{t}-{j}")


def skey(j: int) -> bytes:
    return kvstore.md5_key(f"shared-{j}")


PINNED = kvstore.md5_key("pinned")
SHARED = [skey(j) for j in range(SHARED_KEYS)]
ALL_KEYS = (
    {tkey(t, j) for t in range(THREADS) for j in range(KEYS_PER_THREAD)} | {PINNED} | set(SHARED)
)
now = time.monotonic_ns


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


Interval = tuple[int, int]  # (monotonic ns before the call, after it returned)


def worker(
    db: kvstore.Store,
    t: int,
    model: dict[bytes, bytes],
    writes: list[Interval],
    done: threading.Event,
) -> Callable[[], None]:
    """A thread owning keys tkey(t, *): its model is exact whatever the other threads do."""

    def run() -> None:
        try:
            steps()
        finally:
            done.set()  # also on failure: the compactor waits for every thread

    def steps() -> None:
        rng = random.Random(1000 + t)
        mine = [tkey(t, j) for j in range(KEYS_PER_THREAD)]
        for step in range(OPS_PER_THREAD):
            key = rng.choice(mine)
            op = rng.random()
            if op < 0.30:
                value = rng.randbytes(rng.choice((0, 5, 60, 700)))
                t0 = now()
                db[key] = value
                writes.append((t0, now()))
                model[key] = value
            elif op < 0.50:
                if key in model:
                    assert db[key] == model[key], (t, step)
                else:
                    with pytest.raises(KeyError):
                        db[key]
            elif op < 0.60:
                if key in model:
                    t0 = now()
                    del db[key]
                    writes.append((t0, now()))
                    del model[key]
                else:
                    with pytest.raises(KeyError):
                        del db[key]
            elif op < 0.68:
                assert (key in db) == (key in model)
            elif op < 0.71:
                batch = rng.sample(mine, 60) + rng.sample(mine, 5)  # vectorized path, duplicates
                values = [rng.randbytes(rng.randrange(40)) for _ in batch]
                t0 = now()
                db.put_many(batch, values)
                writes.append((t0, now()))
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

    return run


@dataclass
class RaceLog:
    """What one racer did to the shared keys, each call with its time interval."""

    writes: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # key, value, t0, t1
    reads: list[tuple[int, bytes, int, int]] = field(default_factory=list)


def racer(db: kvstore.Store, r: int, log: RaceLog, done: threading.Event) -> Callable[[], None]:
    """A thread writing and reading the keys every racer shares; each value is unique."""

    def run() -> None:
        try:
            steps()
        finally:
            done.set()

    def steps() -> None:
        rng = random.Random(5000 + r)
        for seq in range(OPS_PER_RACER):
            j = rng.randrange(SHARED_KEYS)
            op = rng.random()
            if op < 0.45:
                value = b"r%d:%d:" % (r, seq) + b"x" * rng.choice((0, 30, 500))
                t0 = now()
                db[SHARED[j]] = value
                log.writes.append((j, value, t0, now()))
            elif op < 0.55:
                js = rng.sample(range(SHARED_KEYS), 3)  # distinct keys: one write each
                values = [b"r%d:%d:%d" % (r, seq, x) for x in js]
                t0 = now()
                db.put_many([SHARED[x] for x in js], values)
                t1 = now()
                log.writes.extend((x, v, t0, t1) for x, v in zip(js, values, strict=True))
            else:
                t0 = now()
                value = db[SHARED[j]]
                log.reads.append((j, value, t0, now()))

    return run


def check_linearizable(
    initial: dict[int, bytes], logs: list[RaceLog], final: dict[int, bytes]
) -> None:
    """Check the racers' shared keys against the real-time order of their calls.

    A linearizable store acts as if each call took effect at one instant between
    its start and its return. So if write x started after write w returned, x took
    effect after w: w cannot be a key's final value, nor what a read that started
    after x returned sees. That is all this check uses, so it is sound (it never
    rejects a linearizable history); it is not complete (overlapping calls may be
    ordered either way, and it accepts both). Values are unique (racer, sequence
    number), so each value names the one call that wrote it; the initial value
    counts as a write that returned before any racer started.
    """
    for j in range(SHARED_KEYS):
        writes = [(initial[j], 0, 0)] + [
            (v, t0, t1) for log in logs for (x, v, t0, t1) in log.writes if x == j
        ]
        by_value = {v: (t0, t1) for v, t0, t1 in writes}
        assert len(by_value) == len(writes), "racer values must be unique"
        latest_start = max(t0 for _, t0, _ in writes)
        # The final value: a write that no other write started after.
        assert final[j] in by_value, f"key {j}: final value {final[j][:20]!r} was never written"
        assert by_value[final[j]][1] >= latest_start, (
            f"key {j}: final value {final[j][:20]!r} was overwritten by a later write"
        )
        # Reads: the value read was written before the read returned, and not
        # overwritten by a write that started after it and returned before the read.
        ends = sorted((t1, t0) for _, t0, t1 in writes)
        end_times = [t1 for t1, _ in ends]
        start_prefix_max = list(itertools.accumulate((t0 for _, t0 in ends), max))
        for log in logs:
            for x, v, r0, r1 in log.reads:
                if x != j:
                    continue
                assert v in by_value, f"key {j}: read {v[:20]!r}, never written"
                w0, w1 = by_value[v]
                assert w0 <= r1, f"key {j}: read {v[:20]!r} before it was written"
                before = bisect.bisect_left(end_times, r0)  # writes that returned before r0
                if before:
                    assert start_prefix_max[before - 1] <= w1, (
                        f"key {j}: read {v[:20]!r}, overwritten before the read began"
                    )


def test_threads_mixing_all_operations_while_compacting(store_path: Path) -> None:
    """Eight owners with exact models, three racers on shared keys, and compaction
    after compaction until every thread is done, so compaction meets a busy store."""
    models: list[dict[bytes, bytes]] = [{} for _ in range(THREADS)]
    writes: list[list[Interval]] = [[] for _ in range(THREADS)]
    logs = [RaceLog() for _ in range(RACERS)]
    dones = [threading.Event() for _ in range(THREADS + RACERS)]
    compactions: list[Interval] = []
    initial = {j: b"initial %d" % j for j in range(SHARED_KEYS)}
    with kvstore.open(store_path, buffer_size=4096) as db:
        # A key no thread deletes, so random_key always has something to return.
        db[PINNED] = b"pinned"
        for j, value in initial.items():
            db[SHARED[j]] = value

        def compactor() -> None:
            while not all(d.is_set() for d in dones):
                t0 = now()
                db.compact()
                compactions.append((t0, now()))

        targets = [worker(db, t, models[t], writes[t], dones[t]) for t in range(THREADS)]
        targets += [racer(db, r, logs[r], dones[THREADS + r]) for r in range(RACERS)]
        run_threads([*targets, compactor])
        # Compaction ran throughout, and writes landed while it was running.
        all_writes = [w for ws in writes for w in ws] + [
            (t0, t1) for log in logs for (_, _, t0, t1) in log.writes
        ]
        assert len(compactions) >= MIN_COMPACTIONS, compactions
        first, last = min(t0 for t0, _ in all_writes), max(t1 for _, t1 in all_writes)
        middle = (first + last) // 2
        for lo, hi in ((first, middle), (middle, last)):  # in each half of the run
            inside = [
                w
                for w in all_writes
                if lo <= w[0] < hi and any(c0 < w[0] and w[1] < c1 for c0, c1 in compactions)
            ]
            assert len(inside) >= MIN_WRITES_INSIDE_COMPACTIONS, (
                f"{len(inside)} writes inside {len(compactions)} compactions "
                f"in {(lo - first) / 1e9:.2f}..{(hi - first) / 1e9:.2f} s"
            )
        final = {j: db[SHARED[j]] for j in range(SHARED_KEYS)}
        check_linearizable(initial, logs, final)
        merged = {k: v for m in models for k, v in m.items()} | {PINNED: b"pinned"}
        merged |= {SHARED[j]: v for j, v in final.items()}
        assert len(db) == len(merged)
        assert set(db) == set(merged)
        assert all(db[k] == v for k, v in merged.items())
        assert db.verify() == []
    with kvstore.open(store_path) as db:
        assert len(db) == len(merged)
        assert {k: db[k] for k in db} == merged  # the files order the writes as memory did
        assert db.verify() == []


def test_the_linearizability_check_rejects_stale_values() -> None:
    """The check above is only useful if it fails: a final value or a read that
    misses a write known to come later is rejected, an overlapping one is not."""
    initial = {j: b"i%d" % j for j in range(SHARED_KEYS)}
    log = RaceLog(writes=[(0, b"a", 10, 20), (0, b"b", 30, 40), (0, b"c", 35, 50)])
    final = initial | {0: b"c"}
    check_linearizable(initial, [log], final)
    check_linearizable(initial, [log], initial | {0: b"b"})  # b and c overlap: either order
    with pytest.raises(AssertionError, match="overwritten by a later write"):
        check_linearizable(initial, [log], initial | {0: b"a"})
    with pytest.raises(AssertionError, match="never written"):
        check_linearizable(initial, [log], initial | {0: b"z"})
    log.reads.append((0, b"a", 45, 60))  # b returned at 40: a read from 45 cannot see a
    with pytest.raises(AssertionError, match="overwritten before the read began"):
        check_linearizable(initial, [log], final)
    log.reads[-1] = (0, b"c", 5, 9)  # c was written from 35
    with pytest.raises(AssertionError, match="before it was written"):
        check_linearizable(initial, [log], final)
    log.reads[-1] = (0, b"a", 25, 32)  # b started at 30, had not returned: a is fine
    check_linearizable(initial, [log], final)


WRITES_PER_COMPACTION = 3000


def test_readers_see_every_record_during_compaction(store_path: Path) -> None:
    """Keys written before compaction starts stay readable throughout it, from other threads."""
    fixed = {kvstore.md5_key(f"f{i}"): bytes([i % 256]) * (i % 3000) for i in range(1500)}
    stop = threading.Event()
    count = [0]
    started = [0]  # count[0] when the latest compaction started
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
                # At most WRITES_PER_COMPACTION past the start of the latest compaction:
                # unbounded, the writer outran each compaction, which then had more to
                # copy (0.3 to 25 s for this test, 140,000 records or more), and those
                # records proved nothing more than the ones written during a compaction.
                if i >= started[0] + WRITES_PER_COMPACTION:
                    stop.wait(0.001)
                    continue
                db[kvstore.md5_key(f"w{i}")] = b"w%d" % i
                count[0] = i + 1

        def compactor() -> None:
            try:
                for c in range(3):
                    while count[0] < 1000 * (
                        c + 1
                    ):  # writes land before and during each compaction
                        stop.wait(0.001)
                    started[0] = count[0]
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
