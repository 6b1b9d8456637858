"""Upkeep never makes damage worse (issue 42): compaction, open and repair on damaged stores.

An outside audit found that the commands that rewrite a store turned damage that
``verify`` and ``repair`` could still mend into silent loss: compaction dropped a live
key whose KEY record had a flipped bit and deleted the old generation; a VAL length
running past the end put a broken generation in place; a writable open cut every
record after one flipped KEY bit. Each case is made here on real files, the way the
audit made it; offsets come from docs/FORMAT.md.
"""

from __future__ import annotations

import itertools
import random
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvstore
from kvstore import _compact
from kvstore.exceptions import CorruptStoreError, KVStoreError

HEADER = 24
KREC = 24
N = 2000


def k(i: int) -> bytes:
    return kvstore.md5_key(str(i))


def value(i: int, version: int = 0) -> bytes:
    return b"value %d of %d " % (version, i) + bytes(range(i % 50))


def build(path: Path, n: int = N, *, churn: bool = False) -> dict[bytes, set[bytes]]:
    """A cleanly closed store of ``n`` keys (with ``churn``: some overwritten, some
    deleted); returns every value ever written under each key."""
    written: dict[bytes, set[bytes]] = {}
    with kvstore.open(path) as db:
        for i in range(n):
            db[k(i)] = value(i)
            written.setdefault(k(i), set()).add(value(i))
        if churn:
            for i in range(0, n, 7):
                db[k(i)] = value(i, 1)
                written[k(i)].add(value(i, 1))
            for i in range(3, n, 11):
                del db[k(i)]
    return written


def key_file(path: Path) -> Path:
    (p,) = path.glob("data-*.key")
    return p


def val_file(path: Path) -> Path:
    (p,) = path.glob("data-*.val")
    return p


def flip(path: Path, byte: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= 1 << bit
    path.write_bytes(bytes(data))


def snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def readable(path: Path) -> dict[bytes, bytes]:
    """Every key a read-only open can read, with its value (damaged ones left out)."""
    out = {}
    with kvstore.open(path, readonly=True) as ro:
        for key in ro:
            try:
                out[key] = ro[key]
            except CorruptStoreError:
                pass
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", *args], capture_output=True, text=True, timeout=120
    )


def key_record_of(path: Path, i: int) -> int:
    """The index of key ``i``'s (only) KEY record in a store built without churn."""
    recs = np.fromfile(key_file(path), dtype=[("key", "V16"), ("off", "<i8")], offset=HEADER)
    return int(np.flatnonzero(recs["key"] == np.void(k(i)))[0])


class TestCompactionChecksWhatItCopies:
    @pytest.mark.parametrize("where", [3, 11, 16, 19])  # key bytes, offset bytes
    def test_a_flipped_key_record_stops_it_and_changes_nothing(
        self, tmp_path: Path, where: int
    ) -> None:
        """The audit's case: one bit in the middle of the KEY file of a cleanly closed
        store (the saved index still trusted), then compact: one key was lost, exit 0."""
        store = tmp_path / "store"
        build(store)
        flip(key_file(store), HEADER + KREC * (N // 2) + where, 4)
        before = snapshot(store)
        assert readable(store) == {k(i): value(i) for i in range(N)}
        done = cli("compact", str(store))
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvstore: error: ")
        assert "compaction stopped, nothing changed" in lines[0]
        assert f"python -m kvstore repair {store}" in lines[0]
        assert snapshot(store) == before
        assert readable(store) == {k(i): value(i) for i in range(N)}
        assert cli("repair", str(store)).returncode == 0
        assert cli("compact", str(store)).returncode == 0
        assert readable(store) == {k(i): value(i) for i in range(N)}
        assert cli("verify", str(store)).returncode == 0

    def test_a_value_length_past_the_end_stops_it_and_leaves_the_old_generation(
        self, tmp_path: Path
    ) -> None:
        """The audit's second case: a raw ValueError, the broken new generation already
        in place, and the next writable open cut 1,600 of 2,000 keys."""
        store = tmp_path / "store"
        build(store)
        victim = N // 2
        recs = np.fromfile(key_file(store), dtype=[("key", "V16"), ("off", "<i8")], offset=HEADER)
        flip(val_file(store), int(recs["off"][victim]) + 3, 6)  # the length field's high byte
        before = snapshot(store)
        done = cli("compact", str(store))
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert k(victim).hex() in lines[0] and "runs past the end" in lines[0]
        assert snapshot(store) == before  # no new generation, no .tmp left
        with kvstore.open(store) as db:  # a writable open keeps every other record
            assert len(db) == N
            with pytest.raises(CorruptStoreError):
                db[k(victim)]
            del db[k(victim)]  # the value is lost; deleting it lets compaction go on
            db.compact()
        assert readable(store) == {k(i): value(i) for i in range(N) if i != victim}

    def test_a_damaged_value_anywhere_stops_it(self, tmp_path: Path) -> None:
        """A flipped value byte far from the end (no open checks it): compaction checks
        each record's CRC as a get does, and refuses."""
        store = tmp_path / "store"
        build(store)
        recs = np.fromfile(key_file(store), dtype=[("key", "V16"), ("off", "<i8")], offset=HEADER)
        flip(val_file(store), int(recs["off"][10]) + 24 + 5, 0)
        with kvstore.open(store) as db, pytest.raises(CorruptStoreError) as info:
            db.compact()
        assert "CRC mismatch" in str(info.value) and "\n" not in str(info.value)
        assert len(list(store.glob("data-*"))) == 3  # .key, .val and the saved index

    def test_the_new_generation_must_read_back_as_written(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A byte the disk (or a bug) changes on the way: the check before the swap
        finds it, and the old generation stays the store."""
        store = tmp_path / "store"
        build(store, 500)
        real = _compact._Writer._write_val

        def garble(self: _compact._Writer, data: bytes) -> None:
            if len(data) > 100:
                data = data[:50] + bytes([data[50] ^ 1]) + data[51:]
            real(self, data)

        monkeypatch.setattr(_compact._Writer, "_write_val", garble)
        with kvstore.open(store) as db:
            with pytest.raises(CorruptStoreError, match="does not read back as written"):
                db.compact()
            assert db[k(7)] == value(7)  # still the old generation, still open
        assert sorted(p.name for p in store.glob("data-*")) == [
            "data-000001.idx", "data-000001.key", "data-000001.val"
        ]
        assert readable(store) == {k(i): value(i) for i in range(500)}

    def test_a_full_disk_is_one_line_and_changes_nothing(self, tmp_path: Path) -> None:
        """The audit's `BufferError: cannot close exported pointers exist`. A file size
        limit plays the full disk (writes past it fail with EFBIG, SIGXFSZ ignored)."""
        store = tmp_path / "store"
        build(store, 20_000)
        before = snapshot(store)
        limit = (val_file(store).stat().st_size) // 2

        def small_disk() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        done = subprocess.run(
            [sys.executable, "-m", "kvstore", "compact", str(store)],
            capture_output=True, text=True, timeout=120, preexec_fn=small_disk,
        )
        assert done.returncode == 1
        errors = [x for x in done.stderr.splitlines() if x.startswith("kvstore: error:")]
        assert len(errors) == 1 and "File too large" in errors[0], done.stderr
        assert "Traceback" not in done.stderr
        assert {n: b for n, b in snapshot(store).items() if not n.endswith(".idx")} == {
            n: b for n, b in before.items() if not n.endswith(".idx")
        }
        assert readable(store) == {k(i): value(i) for i in range(20_000)}


class TestOpenMendsFromVal:
    def test_a_flipped_key_record_in_the_checked_tail_is_rewritten_not_cut(
        self, tmp_path: Path
    ) -> None:
        """The audit's case: every writable open cut every later record (1,000 of 2,000),
        and repair run after that open restored nothing."""
        store = tmp_path / "store"
        build(store)
        (store / "data-000001.idx").unlink()  # a crash: the open rebuilds and checks
        original = key_file(store).read_bytes()
        flip(key_file(store), HEADER + KREC * (N // 2) + 5, 2)
        with kvstore.open(store) as db:
            assert len(db) == N
            rec = db.recovery
            assert rec is not None and rec.tail is None and rec.mended is not None
            assert rec.mended.records == 1
        assert key_file(store).read_bytes() == original
        assert len(list((store / "recovered").iterdir())) == 1
        assert readable(store) == {k(i): value(i) for i in range(N)}
        assert kvstore.repair(store).unchanged  # repair after the open: nothing left to do
        assert cli("verify", str(store)).returncode == 0

    def test_many_damaged_key_records_across_chunks_are_all_rewritten(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """120 KEY records in a row damaged (keys and offsets), a damaged value among
        them, the open reading 7 records a chunk: every KEY record is rewritten exactly,
        across chunk edges, and the one damaged value is kept in place."""
        from kvstore import _store

        monkeypatch.setattr(_store, "_OPEN_CHUNK", 7)
        store = tmp_path / "store"
        build(store, 500)
        (store / "data-000001.idx").unlink()
        original = key_file(store).read_bytes()
        for i in range(200, 320):
            flip(key_file(store), HEADER + KREC * i + (3 if i % 3 else 20), i % 8)
        recs = np.fromfile(key_file(store), dtype=[("key", "V16"), ("off", "<i8")],
                           offset=HEADER)
        victim = 400
        flip(val_file(store), int(recs["off"][victim]) + 24 + 1, 0)  # a value byte
        with kvstore.open(store) as db:
            rec = db.recovery
            assert rec is not None and rec.tail is None and rec.mended is not None
            assert (rec.mended.records, rec.mended.kept_damaged) == (120, 1)
            with pytest.raises(CorruptStoreError):
                db[k(victim)]
        assert key_file(store).read_bytes() == original
        assert readable(store) == {k(i): value(i) for i in range(500) if i != victim}

    @pytest.mark.parametrize("cut", [KREC // 2, 3 * KREC, 3 * KREC + 5])
    def test_a_key_file_cut_short_loses_nothing(self, tmp_path: Path, cut: int) -> None:
        """A KEY file cut short (a torn append, or damage): VAL still names every record,
        so the open writes the missing KEY records from it and cuts only a partial one
        (into recovered/); repair after that open finds nothing to do. The audit: repair
        restored what the open had cut only when run before it."""
        store = tmp_path / "store"
        build(store)
        (store / "data-000001.idx").unlink()
        original = key_file(store).read_bytes()
        with open(key_file(store), "r+b") as f:
            f.truncate(HEADER + KREC * N - cut)
        with kvstore.open(store, readonly=True) as ro:  # the view, the files untouched
            assert len(ro) == N
        assert len(key_file(store).read_bytes()) == HEADER + KREC * N - cut
        with kvstore.open(store) as db:
            rec = db.recovery
            assert rec is not None and rec.mended is not None
            assert rec.mended.added == -(-cut // KREC)
        assert key_file(store).read_bytes() == original
        partial = list((store / "recovered").glob("*.key")) if cut % KREC else []
        assert [p.read_bytes() for p in partial] == (
            [original[HEADER + KREC * (N - -(-cut // KREC)) : HEADER + KREC * N - cut]]
            if cut % KREC else [])
        assert kvstore.repair(store).unchanged
        assert readable(store) == {k(i): value(i) for i in range(N)}


# --------------------------------------------------------------------------- the fuzz

OPS = ("compact", "open", "repair", "verify")
FUZZ_KEYS = 300


def _damage(path: Path, rng: random.Random) -> str:
    """One random single-bit flip or truncation of KEY or VAL (past the headers)."""
    target = key_file(path) if rng.random() < 0.5 else val_file(path)
    size = target.stat().st_size
    if rng.random() < 0.8:
        byte, bit = rng.randrange(HEADER, size), rng.randrange(8)
        flip(target, byte, bit)
        return f"flip {target.name} byte {byte} bit {bit}"
    cut = rng.randrange(HEADER, size)
    with open(target, "r+b") as f:
        f.truncate(cut)
    return f"cut {target.name} at {cut}"


def _run(op: str, path: Path) -> None:
    """One upkeep command; a refusal is a KVStoreError of one line."""
    try:
        if op == "compact":
            with kvstore.open(path) as db:
                db.compact()
        elif op == "open":
            with kvstore.open(path) as db:
                db.flush()
        elif op == "repair":
            kvstore.repair(path)
        else:
            with kvstore.open(path, readonly=True) as ro:
                ro.verify_report()
    except KVStoreError as exc:
        assert "\n" not in str(exc), f"{op}: a refusal of more than one line: {exc}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("saved_index", [True, False])
def test_fuzz_no_upkeep_order_loses_a_readable_record(
    tmp_path: Path, seed: int, saved_index: bool
) -> None:
    """Random single-bit flips and truncations of KEY and VAL, then compact, a writable
    open, repair and verify in every order: every record a read could give before
    still reads after each step, with a value that was written under its key (a
    repair may bring a newer one back, or the delete of a key the damage brought
    back), unless a step refused with one line."""
    pristine = tmp_path / "pristine"
    written = build(pristine, FUZZ_KEYS, churn=True)
    truth = readable(pristine)
    if not saved_index:
        (pristine / "data-000001.idx").unlink()
    rng = random.Random(1000 * seed + saved_index)
    for trial in range(3):
        damaged = tmp_path / f"damaged{trial}"
        shutil.copytree(pristine, damaged)
        what = _damage(damaged, rng)
        try:
            before = readable(damaged)
        except KVStoreError:
            before = {}  # a damaged header: every command refuses
        for order in itertools.permutations(OPS):
            dest = tmp_path / "run"
            shutil.copytree(damaged, dest)
            for step, op in enumerate(order):
                _run(op, dest)
                try:
                    after = readable(dest)
                except KVStoreError:
                    after = {}
                for key in before:
                    if key not in after and key not in truth:
                        continue  # a deleted key that the damage brought back, deleted again
                    assert key in after, f"{what}; {order[: step + 1]}: lost {key.hex()}"
                    assert after[key] in written[key], f"{what}; {order[: step + 1]}"
            shutil.rmtree(dest)
        shutil.rmtree(damaged)


def test_fuzz_damage_reaches_every_branch(tmp_path: Path) -> None:
    """The fuzz is not idle: on these seeds compaction refuses some stores and an open
    mends or cuts some (a check that the damage lands where upkeep must look)."""
    pristine = tmp_path / "pristine"
    build(pristine, FUZZ_KEYS, churn=True)
    refused = mended = 0
    for seed in range(40):
        dest = tmp_path / f"d{seed}"
        shutil.copytree(pristine, dest)
        _damage(dest, random.Random(seed))
        try:
            with kvstore.open(dest) as db:
                mended += db.recovery is not None
                db.compact()
        except CorruptStoreError:
            refused += 1
        shutil.rmtree(dest)
    assert refused > 0 and mended > 0


def test_the_fuzz_catches_the_audits_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With compaction's completeness check taken out, the fuzz's property fails: a
    flipped KEY record under a trusted saved index loses its key."""
    monkeypatch.setattr(_compact.Compaction, "check_complete", lambda self, index: None)
    store = tmp_path / "store"
    build(store, FUZZ_KEYS)
    flip(key_file(store), HEADER + KREC * key_record_of(store, 100) + 2, 1)
    before = readable(store)
    assert k(100) in before
    _run("compact", store)
    assert k(100) not in readable(store)
