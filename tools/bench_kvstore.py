"""Benchmark kvstore against sqlite3 and LMDB (issue 2). A measurement tool, not a test.

Usage (from the repository root; needs ``pip install -e '.[bench]'`` for LMDB):

    python tools/bench_kvstore.py                        # N = 1M and 10M, medians of 3
    python tools/bench_kvstore.py --n 20000 --repeat 1   # a quick smoke run
    python tools/bench_kvstore.py --n 1000000 --ops put_many,get_warm --peers lmdb
    python tools/bench_kvstore.py --json out.json --dir /mnt/ssd/tmp --keep-dir

Peers (``--peers``): sqlite3, LMDB and ``pyset``, a Python ``set`` of the same 16-byte keys
in the same loops (the bar for ``in``; it holds no values, so it runs only the put, exists,
contains_many and delete ops, and is rebuilt untimed from the seed in every worker).
The kvstore backend that ran (``c`` or ``python``, see kvstore/_backend.py) is printed with
the machine and kept in every kvstore record; ``KVSTORE_PURE_PYTHON=1`` benchmarks the
pure-Python code.

Ops (``--ops``, comma-separated or repeated; default all):
  put_loop        ``store[k] = v`` for N new keys in a Python loop, then flush (peers: one txn)
  put_many        batches of ``--batch`` keys (default 100k), then flush; the store it builds
                  feeds the ops below
  exists_present  ``k in store`` in a loop over the N keys, in a shuffled order
  exists_absent   the same over N keys that are not in the store
  contains_many   one call over the whole (N, 16) array of present keys (peers: batched IN / cursor)
  get_warm        ``store[k]`` over the N keys in a shuffled order, files already in the page cache
  delete          ``del store[k]`` over the N keys in a shuffled order, then flush (peers: one txn)
  open            open an existing N-key store (kvstore rebuilds its index: KEY records/s); also
                  RSS per key: (RSS after open - RSS of the fresh interpreter) / N, and RSS / N
Disk bytes (sum of file sizes) are taken after every put_many build, with the store closed.

Method: keys are 16 random bytes from ``numpy.random.default_rng([seed, 0])``, values 100 bytes
from a pool of 256. Every measurement runs in a fresh process (this script with ``--worker``), which
generates its own keys from the seed and times only the operation: inputs (a numpy array, and for
loops a list of bytes, which is what a Python caller holds) are built before the clock starts, and
correctness is checked on samples after it stops. The table shows medians over ``--repeat`` runs
and kvstore/peer ratios (rates: > 1 means kvstore is faster; bytes: < 1 means kvstore is smaller).
Peers are tuned to be fair to a buffered store: sqlite3 uses a WITHOUT ROWID table, WAL,
synchronous=OFF, a 64 MiB cache and mmap, one transaction per load/delete and one read
transaction per read loop; LMDB uses sync=False, one write txn per load, ``putmulti`` for
batches, ``txn.get`` for exists/get and a cursor's ``set_key`` for contains_many.

Results: a markdown table on stdout (progress on stderr) and JSON with every raw worker record
in ``bench-results/kvstore-<timestamp>.json`` (git-ignored). Stores are built under ``--dir``
(default bench-results/) and removed afterwards unless ``--keep-dir``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from tools import _benchutil as bu
except ModuleNotFoundError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools import _benchutil as bu

if TYPE_CHECKING:
    import numpy as np

REPO = Path(__file__).resolve().parent.parent
STORES = ("kvstore", "sqlite", "lmdb", "pyset")
PUT_OPS = ("put_loop", "put_many")
READ_OPS = ("open", "exists_present", "exists_absent", "contains_many", "get_warm")
ALL_OPS = (*PUT_OPS, *READ_OPS, "delete")
DEFAULT_NS = (1_000_000, 10_000_000)
DEFAULT_SEED = 20240601
DEFAULT_BATCH = 100_000
VALUE_SIZE = 100
VALUE_POOL = 256
SAMPLE = 1000  # keys checked after each timed run
ABSENT_PROBE = b"\0" * 16  # the lookup that makes a lazy peer (sqlite) really open its file

# Streams of numpy.random.default_rng([seed, stream]).
PRESENT, ABSENT, ORDER, VALUES = 0, 1, 2, 3


# --------------------------------------------------------------------------- inputs

def make_keys(seed: int, n: int, stream: int) -> np.ndarray:
    """(n, 16) uint8 array of random keys; the same seed gives the same keys in every process."""
    import numpy as np

    rng = np.random.default_rng([seed, stream])
    return np.frombuffer(rng.bytes(16 * n), dtype=np.uint8).reshape(n, 16)


def as_bytes_list(keys: np.ndarray) -> list[bytes]:
    # 'V16' converts to bytes without the trailing-NUL stripping of 'S16'.
    out: list[bytes] = keys.view("V16").ravel().tolist()
    return out


def value_pool(seed: int) -> list[bytes]:
    import numpy as np

    blob = np.random.default_rng([seed, VALUES]).bytes(VALUE_SIZE * VALUE_POOL)
    return [blob[i : i + VALUE_SIZE] for i in range(0, len(blob), VALUE_SIZE)]


def values_for(pool: list[bytes], n: int) -> list[bytes]:
    """Value of key i is pool[i % len(pool)]: a list of references, like a caller's list."""
    reps = n // len(pool) + 1
    return (pool * reps)[:n]


# --------------------------------------------------------------------------- drivers

_LMDB_TXN_DELETES = 1_000_000

class Driver:
    """One store behind the operations the benchmark times. Loops bind methods to locals."""

    name = ""
    ops: frozenset[str] = frozenset(ALL_OPS)  # what it can run
    has_files = True
    has_values = True

    def __init__(self, n: int, seed: int = DEFAULT_SEED) -> None:
        self.n = n
        self.seed = seed

    def load(self) -> None:
        """Import the store's module (before the RSS baseline)."""

    def open(self, path: str, create: bool) -> None:
        raise NotImplementedError

    def probe(self, key: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def put_loop(self, keys: list[bytes], values: list[bytes]) -> None:
        raise NotImplementedError

    def put_many(self, arr: np.ndarray, keys: list[bytes], values: list[bytes], batch: int) -> None:
        raise NotImplementedError

    def exists_loop(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    def contains_many(self, arr: np.ndarray, keys: list[bytes]) -> np.ndarray:
        raise NotImplementedError

    def get_loop(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    def delete_loop(self, keys: list[bytes]) -> None:
        raise NotImplementedError

    # untimed checks
    def exists(self, key: bytes) -> bool:
        raise NotImplementedError

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def records(self) -> int:
        """Records the open had to read (kvstore: KEY records); peers: live keys."""
        return self.count()

    def extra(self) -> dict[str, Any]:
        return {}


class KvstoreDriver(Driver):
    name = "kvstore"

    def load(self) -> None:
        import kvstore

        self.mod = kvstore

    def open(self, path: str, create: bool) -> None:
        self.db = self.mod.open(path)

    def probe(self, key: bytes) -> None:
        key in self.db  # noqa: B015 - the lookup is the point

    def close(self) -> None:
        self.db.close()

    def put_loop(self, keys: list[bytes], values: list[bytes]) -> None:
        db = self.db
        for k, v in zip(keys, values, strict=True):
            db[k] = v
        db.flush()

    def put_many(self, arr: np.ndarray, keys: list[bytes], values: list[bytes], batch: int) -> None:
        db = self.db
        for i in range(0, len(arr), batch):
            db.put_many(arr[i : i + batch], values[i : i + batch])
        db.flush()

    def exists_loop(self, keys: list[bytes]) -> None:
        db = self.db
        for k in keys:
            k in db  # noqa: B015

    def contains_many(self, arr: np.ndarray, keys: list[bytes]) -> np.ndarray:
        result: np.ndarray = self.db.contains_many(arr)
        return result

    def get_loop(self, keys: list[bytes]) -> None:
        db = self.db
        for k in keys:
            db[k]

    def delete_loop(self, keys: list[bytes]) -> None:
        db = self.db
        for k in keys:
            del db[k]
        db.flush()

    def exists(self, key: bytes) -> bool:
        return key in self.db

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.db.get(key)
        return value

    def count(self) -> int:
        return len(self.db)

    def records(self) -> int:
        return int(self.db.stats().records)

    def extra(self) -> dict[str, Any]:
        import dataclasses

        return {"stats": dataclasses.asdict(self.db.stats())}

    def backend(self) -> str:
        return str(self.mod.BACKEND)


class SqliteDriver(Driver):
    name = "sqlite"
    IN_CHUNK = 1000  # keys per IN (...) query; well under SQLITE_MAX_VARIABLE_NUMBER

    def open(self, path: str, create: bool) -> None:
        if create:
            os.makedirs(path, exist_ok=True)
        self.conn = sqlite3.connect(os.path.join(path, "kv.sqlite"), isolation_level=None)
        for pragma in ("journal_mode=WAL", "synchronous=OFF", "cache_size=-65536",
                       "mmap_size=2147418112"):
            self.conn.execute(f"PRAGMA {pragma}")
        if create:
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
        self.cur = self.conn.cursor()

    def probe(self, key: bytes) -> None:
        self.cur.execute("SELECT 1 FROM kv WHERE k=?", (key,)).fetchone()

    def close(self) -> None:
        self.conn.close()

    def _write(self, body: Callable[[], None]) -> None:
        self.cur.execute("BEGIN")
        body()
        self.cur.execute("COMMIT")

    def put_loop(self, keys: list[bytes], values: list[bytes]) -> None:
        def body() -> None:
            ex = self.cur.execute
            for k, v in zip(keys, values, strict=True):
                ex("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, v))

        self._write(body)

    def put_many(self, arr: np.ndarray, keys: list[bytes], values: list[bytes], batch: int) -> None:
        def body() -> None:
            for i in range(0, len(keys), batch):
                self.cur.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)",
                                     zip(keys[i : i + batch], values[i : i + batch], strict=True))

        self._write(body)

    def exists_loop(self, keys: list[bytes]) -> None:
        def body() -> None:
            ex = self.cur.execute
            for k in keys:
                ex("SELECT 1 FROM kv WHERE k=?", (k,)).fetchone()

        self._write(body)

    def contains_many(self, arr: np.ndarray, keys: list[bytes]) -> np.ndarray:
        import numpy as np

        out = np.empty(len(keys), dtype=bool)
        step = self.IN_CHUNK
        full_sql = "SELECT k FROM kv WHERE k IN (" + ",".join("?" * step) + ")"

        def body() -> None:
            ex = self.cur.execute
            for i in range(0, len(keys), step):
                chunk = keys[i : i + step]
                sql = full_sql if len(chunk) == step else (
                    "SELECT k FROM kv WHERE k IN (" + ",".join("?" * len(chunk)) + ")")
                found = {row[0] for row in ex(sql, chunk)}
                out[i : i + len(chunk)] = [k in found for k in chunk]

        self._write(body)
        return out

    def get_loop(self, keys: list[bytes]) -> None:
        def body() -> None:
            ex = self.cur.execute
            for k in keys:
                ex("SELECT v FROM kv WHERE k=?", (k,)).fetchone()

        self._write(body)

    def delete_loop(self, keys: list[bytes]) -> None:
        def body() -> None:
            ex = self.cur.execute
            for k in keys:
                ex("DELETE FROM kv WHERE k=?", (k,))

        self._write(body)

    def exists(self, key: bytes) -> bool:
        return self.cur.execute("SELECT 1 FROM kv WHERE k=?", (key,)).fetchone() is not None

    def get(self, key: bytes) -> bytes | None:
        row = self.cur.execute("SELECT v FROM kv WHERE k=?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def count(self) -> int:
        return int(self.cur.execute("SELECT count(*) FROM kv").fetchone()[0])


class LmdbDriver(Driver):
    name = "lmdb"

    def load(self) -> None:
        import lmdb

        self.mod = lmdb

    def open(self, path: str, create: bool) -> None:
        # map_size is address space, not memory: generous, so a load never hits MapFullError.
        self.env = self.mod.open(path, map_size=max(1 << 30, self.n * 1024), sync=False,
                                 metasync=False, max_dbs=0, create=create)

    def probe(self, key: bytes) -> None:
        with self.env.begin() as txn:
            txn.get(key)

    def close(self) -> None:
        self.env.close()

    def put_loop(self, keys: list[bytes], values: list[bytes]) -> None:
        with self.env.begin(write=True) as txn:
            put = txn.put
            for k, v in zip(keys, values, strict=True):
                put(k, v)

    def put_many(self, arr: np.ndarray, keys: list[bytes], values: list[bytes], batch: int) -> None:
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor()
            for i in range(0, len(keys), batch):
                cursor.putmulti(zip(keys[i : i + batch], values[i : i + batch], strict=True))

    def exists_loop(self, keys: list[bytes]) -> None:
        # buffers=True: exists needs no copy of the value.
        with self.env.begin(buffers=True) as txn:
            get = txn.get
            for k in keys:
                get(k)

    def contains_many(self, arr: np.ndarray, keys: list[bytes]) -> np.ndarray:
        import numpy as np

        with self.env.begin() as txn:
            set_key = txn.cursor().set_key
            return np.fromiter((set_key(k) for k in keys), dtype=bool, count=len(keys))

    def get_loop(self, keys: list[bytes]) -> None:
        with self.env.begin() as txn:
            get = txn.get
            for k in keys:
                get(k)

    def delete_loop(self, keys: list[bytes]) -> None:
        # One transaction per million deletes: at 10M keys a single one fails with
        # MDB_TXN_FULL (too many dirty pages).
        for start in range(0, len(keys), _LMDB_TXN_DELETES):
            with self.env.begin(write=True) as txn:
                delete = txn.delete
                for k in keys[start : start + _LMDB_TXN_DELETES]:
                    delete(k)

    def exists(self, key: bytes) -> bool:
        return self.get(key) is not None

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            value: bytes | None = txn.get(key)
            return value

    def count(self) -> int:
        return int(self.env.stat()["entries"])


class SetDriver(Driver):
    """A Python set of the keys: what ``k in s`` costs when nothing else is done."""

    name = "pyset"
    ops = frozenset(("put_loop", "put_many", "exists_present", "exists_absent", "contains_many",
                     "delete"))
    has_files = False
    has_values = False

    def open(self, path: str, create: bool) -> None:
        self.s: set[bytes] = set() if create else set(
            as_bytes_list(make_keys(self.seed, self.n, PRESENT)))

    def probe(self, key: bytes) -> None:
        key in self.s  # noqa: B015

    def close(self) -> None:
        self.s = set()

    def put_loop(self, keys: list[bytes], values: list[bytes]) -> None:
        add = self.s.add
        for k in keys:
            add(k)

    def put_many(self, arr: np.ndarray, keys: list[bytes], values: list[bytes], batch: int) -> None:
        for i in range(0, len(keys), batch):
            self.s.update(keys[i : i + batch])

    def exists_loop(self, keys: list[bytes]) -> None:
        s = self.s
        for k in keys:
            k in s  # noqa: B015

    def contains_many(self, arr: np.ndarray, keys: list[bytes]) -> np.ndarray:
        import numpy as np

        s = self.s
        return np.fromiter((k in s for k in keys), dtype=bool, count=len(keys))

    def delete_loop(self, keys: list[bytes]) -> None:
        discard = self.s.discard
        for k in keys:
            discard(k)

    def exists(self, key: bytes) -> bool:
        return key in self.s

    def count(self) -> int:
        return len(self.s)


DRIVERS: dict[str, type[Driver]] = {
    d.name: d for d in (KvstoreDriver, SqliteDriver, LmdbDriver, SetDriver)
}


# --------------------------------------------------------------------------- worker

def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"verification failed: {what}")


def _sample(n: int) -> range:
    return range(0, n, max(1, n // SAMPLE))


def run_worker(store: str, op: str, n: int, path: str, seed: int, batch: int) -> dict[str, Any]:
    """One timed operation in this (fresh) process; returns the record the parent collects."""
    import numpy as np

    driver = DRIVERS[store](n, seed)
    driver.load()
    if op == "open":
        bu.warm_page_cache(path)
    gc.collect()
    rss_base = bu.rss_bytes()  # a fresh interpreter with numpy and the store's module imported
    rec: dict[str, Any] = {"store": store, "op": op, "n": n, "rss_baseline": rss_base}
    if isinstance(driver, KvstoreDriver):
        rec["backend"] = driver.backend()

    if op == "open":
        t0 = time.perf_counter()
        driver.open(path, create=False)
        driver.probe(ABSENT_PROBE)
        dt = time.perf_counter() - t0
        rss_after = bu.rss_bytes()
        peak = bu.peak_rss_bytes()  # before records() and extra(), which call stats()
        count = driver.records()
        _check(driver.count() == n, f"open sees {driver.count()} keys, expected {n}")
        rec.update(rss_after=rss_after, rss_per_key_net=(rss_after - rss_base) / n,
                   rss_per_key=rss_after / n, peak_per_key_net=(peak - rss_base) / n,
                   **driver.extra())
        driver.close()
    else:
        pool = value_pool(seed)
        present = make_keys(seed, n, PRESENT)
        if op in PUT_OPS:
            arr, order = present, np.arange(n)
        else:
            order = np.random.default_rng([seed, ORDER]).permutation(n)
            arr = make_keys(seed, n, ABSENT) if op == "exists_absent" else present[order]
        del present
        keys = as_bytes_list(arr)
        values = values_for(pool, n) if op in PUT_OPS else []
        driver.open(path, create=op in PUT_OPS)
        if op not in PUT_OPS:
            bu.warm_page_cache(path)
        gc.collect()
        gc.freeze()  # keep the big input lists out of any collection inside the timed region
        count = n
        found = None
        t0 = time.perf_counter()
        if op == "put_loop":
            driver.put_loop(keys, values)
        elif op == "put_many":
            driver.put_many(arr, keys, values, batch)
        elif op in ("exists_present", "exists_absent"):
            driver.exists_loop(keys)
        elif op == "contains_many":
            found = driver.contains_many(arr, keys)
        elif op == "get_warm":
            driver.get_loop(keys)
        elif op == "delete":
            driver.delete_loop(keys)
        else:
            raise ValueError(f"unknown op {op!r}")
        dt = time.perf_counter() - t0
        gc.unfreeze()
        _verify(driver, op, n, keys, order, pool, found)
        driver.close()

    rec.update(seconds=dt, count=count, rate=count / dt, peak_rss=bu.peak_rss_bytes())
    return rec


def _verify(driver: Driver, op: str, n: int, keys: list[bytes], order: np.ndarray,
            pool: list[bytes], found: np.ndarray | None) -> None:
    """Untimed: the operation did what it claims (on samples where a full check costs a run)."""
    if op in PUT_OPS:
        _check(driver.count() == n, f"{op}: {driver.count()} keys stored, expected {n}")
    if op in (*PUT_OPS, "get_warm", "exists_present") and not driver.has_values:
        _check(all(driver.exists(keys[j]) for j in _sample(n)), f"{op}: present keys missing")
    elif op in (*PUT_OPS, "get_warm", "exists_present"):
        for j in _sample(n):
            want = pool[int(order[j]) % len(pool)]
            _check(driver.get(keys[j]) == want, f"{op}: wrong value for key #{j}")
    if op == "exists_absent":
        _check(not any(driver.exists(keys[j]) for j in _sample(n)), "absent keys found")
    if op == "contains_many":
        _check(found is not None and len(found) == n and bool(found.all()),
               "contains_many missed present keys")
    if op == "delete":
        _check(driver.count() == 0, f"delete left {driver.count()} keys")


# --------------------------------------------------------------------------- parent

def _worker_argv(store: str, op: str, n: int, path: Path, args: argparse.Namespace) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", store, "--op", op, "--n", str(n),
            "--dir", str(path), "--seed", str(args.seed), "--batch", str(args.batch)]


def _measure(store: str, op: str, n: int, path: Path, rep: int,
             args: argparse.Namespace) -> dict[str, Any]:
    try:
        rec = bu.run_worker(_worker_argv(store, op, n, path, args), timeout=args.timeout, cwd=REPO)
    except (bu.WorkerError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        rec = {"store": store, "op": op, "n": n, "error": str(exc)}
        print(f"  n={n} rep={rep + 1} {store:8s} {op:15s} ERROR {exc}", file=sys.stderr)
    else:
        print(f"  n={n} rep={rep + 1} {store:8s} {op:15s} {bu.fmt_rate(rec['rate'])}/s "
              f"({rec['seconds']:.3f} s)", file=sys.stderr)
    rec["repeat"] = rep
    return rec


def run_all(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    stores = ["kvstore", *args.peers]
    results: list[dict[str, Any]] = []
    need_build = any(op in args.ops for op in (*READ_OPS, "delete", "put_many"))
    for n in args.n:
        for rep in range(args.repeat):
            for store in stores:  # interleaved, so machine noise spreads over all stores
                driver = DRIVERS[store]
                if "put_loop" in args.ops:
                    path = workdir / f"{store}-{n}-r{rep}-loop"
                    results.append(_measure(store, "put_loop", n, path, rep, args))
                    if not args.keep_dir:
                        shutil.rmtree(path, ignore_errors=True)
                if not need_build:
                    continue
                path = workdir / f"{store}-{n}-r{rep}"
                build = _measure(store, "put_many", n, path, rep, args)
                results.append(build)
                if "error" in build:
                    continue
                if driver.has_files:
                    size, allocated = bu.disk_usage(path)
                    results.append({"store": store, "op": "disk", "n": n, "repeat": rep,
                                    "bytes": size, "allocated": allocated})
                for op in (*READ_OPS, "delete"):
                    if op in args.ops and op in driver.ops:
                        results.append(_measure(store, op, n, path, rep, args))
                if not args.keep_dir:
                    shutil.rmtree(path, ignore_errors=True)
    return results


# (metric, source op, record field, unit, lower_is_better)
METRICS: list[tuple[str, str, str, str, bool]] = [
    ("put_loop", "put_loop", "rate", "ops/s", False),
    ("put_many", "put_many", "rate", "ops/s", False),
    ("exists_present", "exists_present", "rate", "ops/s", False),
    ("exists_absent", "exists_absent", "rate", "ops/s", False),
    ("contains_many", "contains_many", "rate", "keys/s", False),
    ("get_warm", "get_warm", "rate", "ops/s", False),
    ("delete", "delete", "rate", "ops/s", False),
    ("open", "open", "rate", "records/s", False),
    ("RSS/key net", "open", "rss_per_key_net", "B/key", True),
    ("RSS/key plain", "open", "rss_per_key", "B/key", True),
    ("peak RSS/key net", "open", "peak_per_key_net", "B/key", True),
    ("disk", "disk", "bytes", "bytes", True),
    ("disk/key", "disk", "bytes_per_key", "B/key", True),
]

# metric -> (absolute target, is a minimum, text); relative targets are handled in _target.
TARGETS: dict[str, tuple[float, bool, str]] = {
    "put_loop": (1e6, True, ">= 1M/s"),
    "put_many": (3e6, True, ">= 3M/s"),
    "exists_present": (1.5e6, True, ">= 1.5M/s, >= 2x lmdb, >= 0.6x pyset"),
    "exists_absent": (1.5e6, True, ">= 1.5M/s, >= 2x lmdb, >= 0.6x pyset"),
    "contains_many": (20e6, True, ">= 20M/s"),
    "delete": (1e6, True, ">= 1M/s"),
    "open": (5e6, True, ">= 5M rec/s"),
    "RSS/key net": (32.0, False, "<= 32 B/key at 10M"),
}


def summarize(results: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, float]]]:
    """n -> metric -> store -> median over repeats."""
    samples: dict[tuple[int, str, str], list[float]] = {}
    for rec in results:
        if "error" in rec:
            continue
        if rec["op"] == "disk":
            rec = {**rec, "bytes_per_key": rec["bytes"] / rec["n"]}
        for metric, op, field, _unit, _low in METRICS:
            if rec["op"] == op and field in rec:
                samples.setdefault((rec["n"], metric, rec["store"]), []).append(float(rec[field]))
    out: dict[int, dict[str, dict[str, float]]] = {}
    for (n, metric, store), vals in samples.items():
        out.setdefault(n, {}).setdefault(metric, {})[store] = bu.median(vals)
    return out


def _target(metric: str, row: dict[str, float]) -> tuple[str, str]:
    ours = row.get("kvstore")
    if metric == "get_warm":
        peer = row.get("lmdb")
        if ours is None or peer is None:
            return ">= lmdb", ""
        return ">= lmdb", "yes" if ours >= peer else f"NO ({ours / peer:.2f}x lmdb)"
    if metric not in TARGETS:
        return "", ""
    goal, at_least, text = TARGETS[metric]
    if ours is None:
        return text, ""
    misses = []
    if (ours < goal) if at_least else (ours > goal):
        misses.append(f"{ours / goal:.2f}x target")
    if metric.startswith("exists") and row.get("lmdb") and ours < 2 * row["lmdb"]:
        misses.append(f"{ours / row['lmdb']:.2f}x lmdb")
    if metric.startswith("exists") and row.get("pyset") and ours < 0.6 * row["pyset"]:
        misses.append(f"{ours / row['pyset']:.2f}x pyset")
    return text, "yes" if not misses else "NO (" + ", ".join(misses) + ")"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "bytes":
        return bu.fmt_bytes(value)
    if unit == "B/key":
        return f"{value:.1f}"
    return bu.fmt_rate(value)


def render_table(summary: dict[int, dict[str, dict[str, float]]], peers: Sequence[str]) -> str:
    headers = ["N", "measure", "unit", "kvstore", *peers, *(f"kvstore/{p}" for p in peers),
               "target", "met"]
    rows = []
    for n in sorted(summary):
        for metric, _op, _field, unit, _low in METRICS:
            row = summary[n].get(metric)
            if not row:
                continue
            ours = row.get("kvstore")
            ratios = [f"{ours / row[p]:.2f}x" if ours is not None and row.get(p) else "-"
                      for p in peers]
            target, met = _target(metric, row)
            rows.append([f"{n:,}", metric, unit, _fmt(ours, unit),
                         *(_fmt(row.get(p), unit) for p in peers), *ratios, target, met])
    return bu.markdown_table(headers, rows)


def machine(workdir: Path) -> dict[str, Any]:
    info = bu.machine_info(packages=("numpy", "lmdb", "kvcrawl"))
    info["sqlite"] = sqlite3.sqlite_version
    try:
        import lmdb

        info["lmdb_c"] = ".".join(map(str, lmdb.version()))
    except ImportError:
        info["lmdb_c"] = None
    info["bench_filesystem"] = bu.filesystem_of(workdir)
    import kvstore  # what the workers will import too (the same sys.path)

    info["kvstore_backend"] = kvstore.BACKEND
    info["kvstore_path"] = os.path.dirname(kvstore.__file__)
    info["loadavg"] = os.getloadavg()
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                            capture_output=True, text=True).stdout.strip() or None
    except OSError:
        info["git_commit"] = None
    return info


def describe(info: dict[str, Any]) -> str:
    pk = info["packages"]
    mem = info["mem_total_bytes"]
    return (f"machine: {info['cpu_model']}, {info['cpu_count']} cores "
            f"({info['affinity_cpus']} usable), {bu.fmt_bytes(mem)} RAM, {info['platform']}\n"
            f"python {info['python']}, numpy {pk['numpy']}, lmdb {pk['lmdb']} "
            f"(LMDB {info['lmdb_c']}), sqlite {info['sqlite']}, kvcrawl {pk['kvcrawl']}, "
            f"commit {info['git_commit']}\n"
            f"kvstore backend: {info['kvstore_backend']} ({info['kvstore_path']})\n"
            f"stores on: {info['bench_filesystem']}; load average at start: "
            + ", ".join(f"{x:.2f}" for x in info["loadavg"]))


# --------------------------------------------------------------------------- CLI

def _ops(values: list[str] | None) -> list[str]:
    if not values:
        return list(ALL_OPS)
    ops = [op.strip() for v in values for op in v.split(",") if op.strip()]
    for op in ops:
        if op not in ALL_OPS:
            raise argparse.ArgumentTypeError(f"unknown op {op!r}; choose from {', '.join(ALL_OPS)}")
    return ops


def _peers(value: str) -> list[str]:
    peers = [p.strip() for p in value.split(",") if p.strip()]
    for p in peers:
        if p not in STORES[1:]:
            raise argparse.ArgumentTypeError(f"unknown peer {p!r}; choose from sqlite, lmdb, pyset")
    return peers


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                epilog="See the module docstring for what each op measures.")
    p.add_argument("--n", type=int, action="append",
                   help=f"number of keys; repeatable (default {' '.join(map(str, DEFAULT_NS))})")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement; median shown")
    p.add_argument("--peers", type=_peers, default=["sqlite", "lmdb", "pyset"],
                   help="comma-separated: sqlite,lmdb,pyset (default all; '' for none)")
    p.add_argument("--ops", action="append", metavar="OPS",
                   help=f"comma-separated subset of: {', '.join(ALL_OPS)}")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="put_many batch size")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--dir", type=Path, default=REPO / "bench-results",
                   help="where stores are built (default bench-results/)")
    p.add_argument("--keep-dir", action="store_true", help="keep the stores after the run")
    p.add_argument("--json", type=Path, help="default bench-results/kvstore-<timestamp>.json")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per worker")
    p.add_argument("--worker", choices=STORES, help=argparse.SUPPRESS)
    p.add_argument("--op", choices=ALL_OPS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.ops = _ops(args.ops)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.n = args.n or list(DEFAULT_NS)
    if args.repeat < 1 or args.batch < 1 or min(args.n) < 1:
        p.error("--repeat, --batch and --n must be positive")
    if args.worker and not args.op:
        p.error("--worker needs --op")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        bu.emit(run_worker(args.worker, args.op, args.n[0], str(args.dir), args.seed, args.batch))
        return 0

    stamp = bu.timestamp()
    args.dir.mkdir(parents=True, exist_ok=True)
    workdir = args.dir / f"kvstore-stores-{stamp}-{os.getpid()}"
    workdir.mkdir()
    info = machine(workdir)
    shown = argv if argv is not None else sys.argv[1:]
    command = "python tools/bench_kvstore.py " + " ".join(shown)
    print(f"$ {command.strip()}\n{describe(info)}", flush=True)
    started = time.time()
    try:
        results = run_all(args, workdir)
    finally:
        if not args.keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(results)
    print(f"\nmedians of {args.repeat}; ratios: rates > 1 = kvstore faster, bytes < 1 = smaller\n")
    print(render_table(summary, args.peers))
    ran = {r["backend"] for r in results if r.get("backend")}
    if ran - {info["kvstore_backend"]}:
        print(f"- warning: kvstore workers ran the {sorted(ran)} backend(s)")
    errors = [r for r in results if "error" in r]
    for r in errors:
        print(f"- error: n={r['n']} {r['store']} {r['op']} rep {r['repeat'] + 1}: {r['error']}")

    out = args.json or REPO / "bench-results" / f"kvstore-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": command.strip(), "machine": info, "started": started,
           "elapsed_s": time.time() - started, "args": {k: str(v) if isinstance(v, Path) else v
                                                        for k, v in vars(args).items()},
           "summary": {str(n): m for n, m in summary.items()}, "results": results}
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"\nJSON: {out}" + (f"; stores kept in {workdir}" if args.keep_dir else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
