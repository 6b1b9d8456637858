"""kill -9 of a writer at random moments, while writing and while compacting.

Every operation whose ``flush()`` returned before the kill must be in the store
after it is reopened, with the exact value; the store must then accept writes.
The child is crash_writer.py; its keys and values are functions of a step number.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import kvstore

HERE = Path(__file__).resolve().parent
KILLS = 20
SEED = 20240601
MIN_DELAY, MAX_DELAY = 0.05, 0.4
# The put writer is killed sooner: it writes ~700,000 records a second (C store), so even
# 0.05 s holds hundreds of flushes and the kill lands at a random point among them; what
# made the test slow (~28 s) was only checking every record of a longer run, round after
# round. (The compaction writer keeps MAX_DELAY: its kills must land inside a compaction.)
PUT_MAX_DELAY = 0.15
COMPACT_PRELOAD = 2500  # keys of ~4 KiB before the first compaction child
MAX_COMPACT_ROUNDS = 80
RECHECK_MARGIN = 5_000  # records before the previous kill whose values are rechecked each round

pytestmark = pytest.mark.slow


def load_writer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_writer", HERE / "crash_writer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


writer = load_writer()


class Keys:
    """key(i) for i in a growing range, cached."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def upto(self, n: int, start: int = 0) -> np.ndarray:
        """keys start..n-1 as an (n - start, 16) array."""
        if n > len(self.keys):
            self.keys.extend(writer.key(i) for i in range(len(self.keys), n))
        return np.frombuffer(b"".join(self.keys[start:n]), dtype=np.uint8).reshape(-1, 16)

    def __getitem__(self, i: int) -> bytes:
        if i >= len(self.keys):
            self.upto(i + 1)
        return self.keys[i]


def run_child(
    python: str, env: dict[str, str], store: Path, mode: str, start: int, delay: float, log: Path
) -> list[str]:
    """Run the writer ``delay`` s past its start, SIGKILL it; return its complete lines."""
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [python, str(HERE / "crash_writer.py"), str(store), mode, str(start)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if first != b"ready\n":
            proc.kill()
            proc.wait()
            pytest.fail(f"writer did not start: {first!r}\n{log.read_text()}")
        try:
            proc.wait(timeout=delay)
            pytest.fail(f"writer exited by itself ({proc.returncode})\n{log.read_text()}")
        except subprocess.TimeoutExpired:
            pass
        os.kill(proc.pid, signal.SIGKILL)
        out = proc.stdout.read()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return out.decode().split("\n")[:-1]  # the last piece is empty or a torn line


def flushed_count(lines: list[str], before: int) -> int:
    counts = [int(line) for line in lines if line.isdigit()]
    return max(counts, default=before)


def assert_single_generation(store: Path) -> None:
    keys = list(store.glob("data-*.key"))
    vals = list(store.glob("data-*.val"))
    assert len(keys) == 1 and len(vals) == 1, sorted(p.name for p in store.iterdir())


def parent_writes(db: kvstore.Store, parent: dict[bytes, bytes], round_no: int) -> None:
    """The recovered store takes new writes (checked again after the next kill)."""
    key = kvstore.md5_key(f"parent{round_no}")
    db[key] = b"p%d" % round_no
    parent[key] = b"p%d" % round_no
    if round_no % 3 == 2:
        old = kvstore.md5_key(f"parent{round_no - 1}")
        del db[old]
        del parent[old]


@pytest.mark.slow
def test_kill_during_puts(tmp_path: Path, python: str, child_env: dict[str, str]) -> None:
    store = tmp_path / "store"
    log = tmp_path / "child.stderr"
    rng = random.Random(SEED)
    keys = Keys()
    parent: dict[bytes, bytes] = {}
    check_rng = random.Random(SEED + 2)
    flushed = 0
    for round_no in range(KILLS):
        previous = flushed
        lines = run_child(
            python, child_env, store, "put", flushed, rng.uniform(MIN_DELAY, PUT_MAX_DELAY), log
        )
        flushed = flushed_count(lines, flushed)
        with kvstore.open(store) as db:
            # Every flushed put is present (deleted ones absent), in one vectorized look.
            arr = keys.upto(flushed)
            present = db.contains_many(arr)
            idx = np.arange(flushed)
            surely_deleted = (idx % 10 == 4) & (idx + 5 < flushed)
            maybe_deleted = (idx % 10 == 4) & (idx + 5 >= flushed)
            missing = np.flatnonzero(~present & ~surely_deleted & ~maybe_deleted)
            assert len(missing) == 0, (
                f"round {round_no}: {len(missing)} flushed puts lost, first {missing[:5]}"
            )
            resurrected = np.flatnonzero(present & surely_deleted)
            assert len(resurrected) == 0, (
                f"round {round_no}: flushed deletes undone: {resurrected[:5]}"
            )
            # ... with the exact value. Each round checks every record from a margin before
            # the previous kill on (where a recovery bug would strike) and a sample of the
            # older ones; the end of the test checks every one of them.
            lo = max(0, previous - RECHECK_MARGIN)
            recent = np.flatnonzero(present[lo:]) + lo
            older = np.flatnonzero(present[:lo])
            sample = older[check_rng.sample(range(len(older)), min(len(older), 3000))]
            for i in [*recent.tolist(), *sample.tolist()]:
                assert db[keys[i]] == writer.small_value(i), f"round {round_no}: key {i}"
            # Puts after the last reported flush may have landed; if so, they are intact.
            ahead = keys.upto(flushed + 400_000, flushed)
            for j in np.flatnonzero(db.contains_many(ahead)).tolist():
                assert db[keys[flushed + j]] == writer.small_value(flushed + j)
            for key, value in parent.items():
                assert db[key] == value
            parent_writes(db, parent, round_no)
        assert_single_generation(store)
    assert flushed > KILLS * writer.FLUSH_EVERY, "the writer hardly wrote anything before the kills"
    with kvstore.open(store, readonly=True) as ro:
        present = ro.contains_many(keys.upto(flushed))
        for i in np.flatnonzero(present).tolist():
            assert ro[keys[i]] == writer.small_value(i), f"key {i}"
        assert ro.verify() == []


@pytest.mark.slow
def test_kill_during_compaction(tmp_path: Path, python: str, child_env: dict[str, str]) -> None:
    store = tmp_path / "store"
    log = tmp_path / "child.stderr"
    rng = random.Random(SEED + 1)
    keys = Keys()
    parent: dict[bytes, bytes] = {}
    with kvstore.open(store) as db:
        db.put_many(
            keys.upto(COMPACT_PRELOAD), [writer.big_value(i) for i in range(COMPACT_PRELOAD)]
        )
    flushed = COMPACT_PRELOAD
    in_compaction = 0
    rounds = 0
    while in_compaction < KILLS:
        assert rounds < MAX_COMPACT_ROUNDS, (
            f"only {in_compaction} of {rounds} kills landed in a compaction"
        )
        lines = run_child(
            python, child_env, store, "compact", flushed, rng.uniform(MIN_DELAY, MAX_DELAY), log
        )
        flushed = flushed_count(lines, flushed)
        events = [line for line in lines if line in ("compacting", "compacted")]
        if events and events[-1] == "compacting":
            in_compaction += 1
        with kvstore.open(store) as db:
            arr = keys.upto(flushed)
            present = db.contains_many(arr)
            missing = np.flatnonzero(~present)
            assert len(missing) == 0, (
                f"round {rounds}: {len(missing)} flushed records lost, first {missing[:5]}"
            )
            for i in range(flushed):
                assert db[keys[i]] == writer.big_value(i), f"round {rounds}: key {i}"
            ahead = keys.upto(flushed + 2000, flushed)
            for j in np.flatnonzero(db.contains_many(ahead)).tolist():
                assert db[keys[flushed + j]] == writer.big_value(flushed + j)
            for key, value in parent.items():
                assert db[key] == value
            # Nothing else is live but scratch keys whose delete had not landed.
            known = set(keys.keys[: flushed + len(ahead)]) | set(parent)
            extra = set(db) - known
            assert extra <= {writer.scratch_key(i) for i in range(flushed + len(ahead) + 1)}
            assert db.verify() == []
            parent_writes(db, parent, rounds)
        assert_single_generation(store)
        rounds += 1
