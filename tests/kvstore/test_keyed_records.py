"""A value names its key (format 3): the damage an outside audit found is caught, and fixed.

The audit (issue 27): one flipped bit in a KEY record's offset made ``db[k]`` return
another key's value, CRC-valid, after any open that rebuilt the index; a flipped bit
in a KEY record's key lost the record and made a phantom key, and ``verify`` said ok;
a tombstone whose key flipped brought a deleted key back; a KEY file cut at a record
boundary passed ``verify``. Each case here damages real files the way the audit did.
Offsets and sizes come from docs/FORMAT.md, never from the store.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import threading
import zlib
from pathlib import Path

import pytest
from after_crash import as_after_a_crash
from plain_format import write_plain_store

import kvstore
from kvstore import cli
from kvstore.exceptions import CorruptStoreError, StoreLockedError

HEADER = 24
KREC = 24
RHDR = 24  # a VAL record's header: u32 length, u32 CRC, the key
N = 3000
VALUE = 100
TAIL = 4096  # the open CRC-checks only this much of VAL: the damage lies before it


def k(i: int | str) -> bytes:
    return kvstore.md5_key(str(i))


def value(i: int) -> bytes:
    return (b"value %05d " % i) * (VALUE // 12) + b"." * (VALUE % 12)


def val_offset(i: int) -> int:
    return HEADER + i * (RHDR + VALUE)


def key_offset(i: int) -> int:
    return HEADER + i * KREC


def data_pair(path: Path) -> tuple[Path, Path]:
    (key_file,) = path.glob("data-*.key")
    (val_file,) = path.glob("data-*.val")
    return key_file, val_file


def read_all(path: Path, **kw: object) -> dict[bytes, bytes | str]:
    """Every key's value, or "corrupt" where the read raises CorruptStoreError."""
    out: dict[bytes, bytes | str] = {}
    with kvstore.open(path, readonly=True, tail_check_bytes=TAIL, **kw) as ro:
        for key in ro:
            try:
                out[key] = ro[key]
            except CorruptStoreError:
                out[key] = "corrupt"
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N puts of k(i) -> value(i), each VALUE bytes, cleanly closed; laid out as FORMAT.md says."""
    path = tmp_path_factory.mktemp("keyed") / "store"
    with kvstore.open(path) as db:
        for i in range(N):
            db[k(i)] = value(i)
    _, val_file = data_pair(path)
    data = val_file.read_bytes()
    assert len(data) == val_offset(N)
    head = data[val_offset(7) : val_offset(7) + RHDR]
    length, crc = struct.unpack_from("<II", head)
    assert (length, head[8:]) == (VALUE, k(7))
    assert crc == zlib.crc32(value(7), zlib.crc32(k(7), zlib.crc32(struct.pack("<I", VALUE))))
    return path


@pytest.fixture
def store(pristine: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(pristine, dest)
    (dest / "data-000001.idx").unlink()  # as after a crash: every open rebuilds the index
    return dest


def set_key_record(path: Path, i: int, *, key: bytes | None = None, off: int | None = None) -> None:
    key_file, _ = data_pair(path)
    data = bytearray(key_file.read_bytes())
    if key is not None:
        data[key_offset(i) : key_offset(i) + 16] = key
    if off is not None:
        struct.pack_into("<q", data, key_offset(i) + 16, off)
    key_file.write_bytes(bytes(data))


def verify_cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(["verify", str(path)])
    out, err = capsys.readouterr()
    return status, out, err


VICTIM = 1000  # its value lies ~350 KB before the end of VAL: far outside TAIL


class TestAnotherKeysValueIsNeverHandedOut:
    def test_the_audits_case_an_offset_on_another_keys_record(
        self, store: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        set_key_record(store, VICTIM, off=val_offset(VICTIM + 1))
        for readonly in (True, False):  # any open that rebuilds the index
            with kvstore.open(store, readonly=readonly, tail_check_bytes=TAIL) as db:
                assert db.index_source == "rebuilt" and db.recovery is None
                with pytest.raises(CorruptStoreError, match=k(VICTIM + 1).hex()):
                    db[k(VICTIM)]
                with pytest.raises(CorruptStoreError):
                    db.get(k(VICTIM))
                assert db[k(VICTIM + 1)] == value(VICTIM + 1)
        # The writer's clean close saved an index, which the next open uses (it mends
        # nothing, and verify says no mend); without it (a crash) the open mends.
        status, out, _ = verify_cli(store, capsys)
        assert status == 1 and not any(line.startswith("mend") for line in out.splitlines())
        as_after_a_crash(store)
        status, out, err = verify_cli(store, capsys)
        assert status == 1
        assert out.splitlines()[0] == (
            f"damaged: key {k(VICTIM).hex()} offset {val_offset(VICTIM + 1)}: the VAL record "
            f"belongs to key {k(VICTIM + 1).hex()} (KEY record at offset {key_offset(VICTIM)})"
        )
        # The store is smaller than verify's 1 MiB tail check, so a writable open with the
        # default would check this record and rewrite it from its sound VAL record; so
        # does repair, which needs no open.
        assert out.splitlines()[1].startswith(
            "mend: on a writable open, 1 KEY record rewritten from VAL (first: KEY record at "
            f"offset {key_offset(VICTIM)}"
        )
        assert not any(line.startswith("torn tail") for line in out.splitlines())
        assert "1 damaged record of 3000 checked" in err and "repair" in err
        assert cli.main(["repair", str(store)]) == 0
        assert "1 changed, 0 added, 0 dropped" in capsys.readouterr().out
        assert read_all(store) == {k(i): value(i) for i in range(N)}
        assert verify_cli(store, capsys)[0] == 0

    @pytest.mark.parametrize("bit", range(48))
    def test_every_flipped_offset_bit(self, store: Path, bit: int) -> None:
        """Whatever a flipped offset bit points at (another record, the middle of one, past
        the end), a read gives the victim's own value or raises; verify names the victim."""
        set_key_record(store, VICTIM, off=val_offset(VICTIM) ^ (1 << bit))
        got = read_all(store)
        # An offset past VAL's end is a torn tail to the open, which leaves it and the
        # records after it out (and says so); every key read gives its own value.
        assert all(got[k(i)] == value(i) for i in range(N) if i != VICTIM and k(i) in got)
        assert len(got) in (N, VICTIM)
        assert got.get(k(VICTIM), "corrupt") in ("corrupt", value(VICTIM))
        with kvstore.open(store, readonly=True) as ro:
            report = ro.verify_report()
        assert [(d.key, d.key_offset) for d in report.damages] == [(k(VICTIM), key_offset(VICTIM))]
        assert not report.ok and report.repairable


class TestFlippedKeys:
    def test_200_random_key_flips_are_all_reported_and_repaired(self, tmp_path: Path) -> None:
        """The audit's sample: 9 of 200 random key flips passed verify before."""
        n = 300
        store = tmp_path / "store"
        with kvstore.open(store) as db:
            for i in range(n):
                db[k(i)] = value(i)
        (store / "data-000001.idx").unlink()
        rng = random.Random(27)
        caught = mended = 0
        for trial in range(200):
            dest = tmp_path / f"t{trial}"
            shutil.copytree(store, dest)
            i, bit = rng.randrange(n), rng.randrange(128)
            key = bytearray(k(i))
            key[bit // 8] ^= 1 << (bit % 8)
            set_key_record(dest, i, key=bytes(key))
            # Where the open checks (the default 1 MiB holds this whole store), it rewrites
            # the record from its VAL record (in its view: read-only), so nothing is lost...
            with kvstore.open(dest, readonly=True) as ro:
                assert {key: ro[key] for key in ro} == {k(j): value(j) for j in range(n)}
            # ...where it does not (a small check), the record is lost and the phantom
            # reads as no value; verify finds it either way.
            got = read_all(dest)
            if k(i) not in got:
                assert got.pop(bytes(key), "corrupt") == "corrupt"
            else:
                mended += 1
            assert all(got[k(j)] == value(j) for j in range(n) if k(j) in got)
            with kvstore.open(dest, readonly=True) as ro:
                report = ro.verify_report()
            assert [(d.key, d.key_offset) for d in report.damages] == [(bytes(key), key_offset(i))]
            caught += report.repairable
            kvstore.repair(dest)
            assert read_all(dest) == {k(j): value(j) for j in range(n)}
            shutil.rmtree(dest)
        assert caught == 200
        assert 0 < mended < 200  # both kinds of open were met

    def test_a_tombstone_whose_key_flipped(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "store"
        with kvstore.open(path) as db:
            for i in range(50):
                db[k(i)] = value(i)
            del db[k(10)]
            for i in range(50, 60):  # puts after it: a check of the last one does not reach it
                db[k(i)] = value(i)
        (path / "data-000001.idx").unlink()
        # Record 50 is the tombstone of k(10); its deletion record lies in VAL too.
        _, val_file = data_pair(path)
        deletion = val_offset(50)
        assert val_file.read_bytes()[deletion : deletion + 4] == b"\xff" * 4
        flipped = bytes([k(10)[0] ^ 0x40]) + k(10)[1:]
        set_key_record(path, 50, key=flipped)
        with kvstore.open(path, readonly=True, tail_check_bytes=1) as ro:
            assert ro[k(10)] == value(10)  # unchecked: resurrected, only verify can tell
        with kvstore.open(path, readonly=True) as ro:  # checked: mended from its VAL record
            assert k(10) not in ro and ro[k(50)] == value(50)
        status, out, _ = verify_cli(path, capsys)
        assert status == 1
        assert out.startswith(f"damaged: key {flipped.hex()} offset -1: VAL record at {deletion}: "
                              f"the VAL record belongs to key {k(10).hex()}")
        assert cli.main(["repair", str(path)]) == 0
        assert "1 changed, 0 added, 0 dropped" in capsys.readouterr().out
        with kvstore.open(path) as db:
            assert k(10) not in db and flipped not in db and len(db) == 59
            assert db.verify_report().ok


class TestKeyFileCut:
    @pytest.mark.parametrize("lost", [1, 3])
    def test_cut_at_a_record_boundary_fails_verify_and_repair_brings_them_back(
        self, pristine: Path, tmp_path: Path, lost: int, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "store"
        shutil.copytree(pristine, path)  # with the index its clean close saved
        key_file, _ = data_pair(path)
        os.truncate(key_file, key_offset(N - lost))
        status, out, err = verify_cli(path, capsys)
        assert status == 1
        assert (f"missing: the KEY file is {lost * KREC} bytes shorter than at its last clean "
                f"close ({lost} KEY records lost from its end)") in out.splitlines()
        assert cli.main(["repair", str(path)]) == 0
        assert f"0 changed, {lost} added, 0 dropped" in capsys.readouterr().out
        assert read_all(path) == {k(i): value(i) for i in range(N)}
        assert verify_cli(path, capsys)[0] == 0

    def test_val_alone_rebuilds_a_key_file_that_is_gone(
        self, pristine: Path, tmp_path: Path
    ) -> None:
        path = tmp_path / "store"
        shutil.copytree(pristine, path)
        key_file, _ = data_pair(path)
        key_file.write_bytes(b"")  # header and all
        with pytest.raises(CorruptStoreError):
            kvstore.open(path, readonly=True)
        report = kvstore.repair(path)
        assert (report.records, report.added) == (N, N)
        assert read_all(path) == {k(i): value(i) for i in range(N)}
        saved = [Path(p) for p in report.saved]
        assert [p.read_bytes() for p in saved] == [b""]  # the old KEY file, kept


class TestRepair:
    def test_a_sound_store_is_left_alone(self, pristine: Path, tmp_path: Path) -> None:
        path = tmp_path / "store"
        shutil.copytree(pristine, path)
        before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
        report = kvstore.repair(path)
        assert report.unchanged and report.records == N
        assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} == before

    def test_a_damaged_value_is_refused_and_nothing_changes(
        self, store: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, val_file = data_pair(store)
        data = bytearray(val_file.read_bytes())
        data[val_offset(VICTIM) + RHDR + 5] ^= 1
        val_file.write_bytes(bytes(data))
        before = {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()}
        status, _, err = verify_cli(store, capsys)
        assert status == 1 and "repair" not in err  # repair cannot help here
        assert cli.main(["repair", str(store)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("kvstore: error: ") and "CRC mismatch" in err and err.count("\n") == 1
        assert {p.name: p.read_bytes() for p in store.iterdir() if p.is_file()} == before

    def test_a_torn_last_record_is_cut(self, store: Path) -> None:
        _, val_file = data_pair(store)
        os.truncate(val_file, val_offset(N) - 7)
        report = kvstore.repair(store)
        cut = RHDR + VALUE - 7
        assert (report.records, report.dropped, report.val_bytes_cut) == (N - 1, 1, cut)
        assert read_all(store) == {k(i): value(i) for i in range(N - 1)}

    def test_refuses_while_the_store_is_open(self, store: Path) -> None:
        with kvstore.open(store), pytest.raises(StoreLockedError):
            kvstore.repair(store)

    def test_a_format_2_store_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        write_plain_store(path, [(k(1), b"one")])
        with pytest.raises(CorruptStoreError, match="format 2"):
            kvstore.repair(path)


class TestFormat2Stores:
    """Stores an older kvstore wrote still open, read and take writes; compact moves them on."""

    OPS = [(k(i), value(i)) for i in range(300)] + [(k(5), None), (k(7), b""), (k(9), None)]

    def test_read_write_verify_then_compact_to_format_3(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        model = write_plain_store(path, self.OPS)
        with kvstore.open(path, readonly=True) as ro:
            assert dict(ro.items()) == model and ro.verify_report().ok
        with kvstore.open(path) as db:
            assert dict(db.items()) == model
            db[k(1000)] = b"new"
            db.put_many([k(1001), k(1002)], [b"a", b"b"])
            del db[k(0)]
            model.update({k(1000): b"new", k(1001): b"a", k(1002): b"b"})
            del model[k(0)]
        key_file, val_file = data_pair(path)
        assert key_file.read_bytes()[8:12] == val_file.read_bytes()[8:12] == b"\x02\0\0\0"
        with kvstore.open(path) as db:  # appended as format 2, read back as such
            assert dict(db.items()) == model and db.verify_report().ok
            db.compact()
            assert dict(db.items()) == model
            db[k(2000)] = b"after"
            del db[k(1)]
        model[k(2000)] = b"after"
        del model[k(1)]
        key_file, val_file = data_pair(path)
        assert val_file.read_bytes()[8:12] == b"\x03\0\0\0"
        with kvstore.open(path, readonly=True) as ro:
            assert dict(ro.items()) == model
            report = ro.verify_report()
            assert report.ok and report.format_version == 3

    def test_a_torn_tail_is_recovered_as_before(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        model = write_plain_store(path, [(k(i), value(i)) for i in range(20)])
        _, val_file = data_pair(path)
        os.truncate(val_file, val_file.stat().st_size - 3)
        with kvstore.open(path) as db:
            assert db.recovery is not None and len(db) == 19
            del model[k(19)]
            assert dict(db.items()) == model

    def test_compaction_refuses_to_rewrite_a_damaged_value(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        write_plain_store(path, [(k(i), value(i)) for i in range(200)])
        _, val_file = data_pair(path)
        data = bytearray(val_file.read_bytes())
        data[HEADER + 8 + 3] ^= 1  # the first value's 4th byte
        val_file.write_bytes(bytes(data))
        before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
        with kvstore.open(path, tail_check_bytes=1) as db:
            with pytest.raises(CorruptStoreError, match="CRC"):
                db.compact()
            assert db[k(1)] == value(1)
        after = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
        data_files = {n: b for n, b in after.items() if n.startswith("data-") and ".idx" not in n}
        assert data_files == before

    def test_writers_keep_going_while_a_compaction_moves_the_store_on(self, tmp_path: Path) -> None:
        """Puts, batches and deletes racing the compaction that swaps format 2 for 3:
        each write lands in the layout of the generation it meets."""
        path = tmp_path / "store"
        model = write_plain_store(path, [(k(i), value(i)) for i in range(20_000)])
        errors: list[BaseException] = []
        with kvstore.open(path) as db:
            stop = threading.Event()

            def writer() -> None:
                try:
                    j = 0
                    while not stop.is_set() or j < 200:
                        db[k(f"w{j}")] = b"w%d" % j
                        db.put_many([k(f"m{j}")], [b"m%d" % j])
                        if j < 20_000:  # a slow compaction may outlast them all
                            del db[k(j)]
                        j += 1
                    writer.count = j  # type: ignore[attr-defined]
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    errors.append(exc)

            t = threading.Thread(target=writer)
            t.start()
            db.compact()
            stop.set()
            t.join()
            assert not errors, errors
            for j in range(writer.count):  # type: ignore[attr-defined]
                model[k(f"w{j}")] = b"w%d" % j
                model[k(f"m{j}")] = b"m%d" % j
                model.pop(k(j), None)
            assert dict(db.items()) == model
        with kvstore.open(path, readonly=True) as ro:
            assert dict(ro.items()) == model and ro.verify_report().ok


def test_items_and_values_survive_a_concurrent_delete(tmp_path: Path) -> None:
    """Another thread deleting keys during items()/values() never raises KeyError, and
    every pair seen is a key with its own value (the audit saw 5 of 20 passes fail)."""
    n = 2000
    own = {k(i): value(i) for i in range(n)}
    own_values = set(own.values())
    for rep in range(20):
        with kvstore.open(tmp_path / f"s{rep}") as db:
            db.put_many(list(own), list(own.values()))
            start = threading.Barrier(2)

            def deleter(db: kvstore.Store = db, start: threading.Barrier = start) -> None:
                start.wait()
                for i in range(0, n, 2):
                    del db[k(i)]

            t = threading.Thread(target=deleter)
            t.start()
            start.wait()
            for key, got in db.items():  # the deleter runs while these loops do
                assert got == own[key]
            for got in db.values():
                assert got in own_values
            t.join()
            assert sorted(db.values()) == sorted(value(i) for i in range(1, n, 2))
            db.clear()
            assert len(db) == 0
