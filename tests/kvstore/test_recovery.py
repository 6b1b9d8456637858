"""Recovery on open: torn tails at every byte, bit flips, bad headers, wrong paths, no permission.

The expected state is always computed from the list of operations that built
the store and from the documented layout (docs/FORMAT.md), never from the store.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from after_crash import as_after_a_crash

import kvstore
from kvstore.exceptions import (
    CorruptStoreError,
    NotAStoreError,
    UnsupportedVersionError,
)

HEADER = 24
KREC = 24
VHDR = 24  # a VAL record's header (format 3): u32 length, u32 CRC, the 16-byte key
DELETED = 0xFFFF_FFFF  # the length field of a delete's VAL record


def record(key: bytes, value: bytes | None) -> bytes:
    """A VAL record as FORMAT.md lays it out: the CRC covers length, key and value."""
    length = DELETED if value is None else len(value)
    head = struct.pack("<I", length)
    crc = zlib.crc32(value or b"", zlib.crc32(key, zlib.crc32(head)))
    return head + struct.pack("<I", crc) + key + (value or b"")


def k(i: int | str) -> bytes:
    return kvstore.md5_key(str(i))


def val(i: int, n: int) -> bytes:
    return bytes((i * 31 + j * 7) % 251 for j in range(n))


@dataclass(frozen=True)
class Op:
    key: bytes
    value: bytes | None  # None: delete


def build_ops() -> list[Op]:
    """30 operations: puts of varied length, overwrites, tombstones, empty values, a revival."""
    ops = [Op(k(j % 10), val(j, (j * 53) % 230 + 1)) for j in range(20)]
    ops += [
        Op(k(3), None),
        Op(k(10), b""),
        Op(k(5), None),
        Op(k(3), val(3, 77)),  # revived after its tombstone
        Op(k(11), val(11, 60)),
        Op(k(10), None),  # tombstone of an empty value
        Op(k(0), b""),  # overwrite with an empty value
        Op(k(12), val(12, 100)),
        Op(k(11), None),
        Op(k(13), val(13, 120)),
    ]
    assert len(ops) == 30
    return ops


OPS = build_ops()


def record_size(op: Op) -> int:
    return VHDR + len(op.value or b"")


def val_positions(ops: list[Op]) -> list[int]:
    """Where each operation's VAL record starts (a delete leaves one too)."""
    out, pos = [], HEADER
    for op in ops:
        out.append(pos)
        pos += record_size(op)
    return out


POSITIONS = val_positions(OPS)
# The VAL offset each KEY record states: its record's for a put, None (-1) for a delete.
OFFSETS: list[int | None] = [
    None if op.value is None else pos for op, pos in zip(OPS, POSITIONS, strict=True)
]
VAL_SIZE = HEADER + sum(record_size(op) for op in OPS)
KEY_SIZE_BYTES = HEADER + KREC * len(OPS)


def state_after(ops: list[Op]) -> dict[bytes, bytes]:
    model: dict[bytes, bytes] = {}
    for op in ops:
        if op.value is None:
            model.pop(op.key, None)
        else:
            model[op.key] = op.value
    return model


def kept_after_key_cut(t: int) -> int:
    """Operations that survive truncating the KEY file to t bytes."""
    return min(len(OPS), max(0, (t - HEADER) // KREC))


def kept_after_val_cut(t: int) -> int:
    """Operations before the first whose VAL record (put or delete) does not fit in t bytes."""
    for i, (op, pos) in enumerate(zip(OPS, POSITIONS, strict=True)):
        if pos + record_size(op) > t:
            return i
    return len(OPS)


def val_end_after(ops: list[Op], n: int) -> int:
    """Where VAL's data ends when only ops[:n] are kept: after the last kept record."""
    return HEADER + sum(record_size(op) for op in ops[:n])


def assert_recovered_exactly(
    dest: Path, key_cut: bytes, val_cut: bytes, key_end: int, val_end: int, what: str
) -> None:
    """recovered/ holds the bytes recovery cut from each file, exactly, in files named
    as FORMAT.md says (``...-at<offset>.key|.val``), and nothing when nothing was cut."""
    rdir = dest / "recovered"
    files = sorted(rdir.iterdir()) if rdir.exists() else []
    got = {p.suffix: p for p in files}
    assert len(got) == len(files), f"{what}: {files}"
    expect = {
        suffix: (data, end)
        for suffix, data, end in ((".key", key_cut, key_end), (".val", val_cut, val_end))
        if data
    }
    assert set(got) == set(expect), f"{what}: recovered/ holds {[p.name for p in files]}"
    for suffix, (data, end) in expect.items():
        assert got[suffix].read_bytes() == data, (
            f"{what}: recovered/{got[suffix].name} is not exactly the {len(data)} cut bytes"
        )
        assert got[suffix].name.endswith(f"-at{end}{suffix}"), f"{what}: {got[suffix].name}"


def data_pair(path: Path) -> tuple[Path, Path]:
    keys = sorted(path.glob("data-*.key"))
    vals = sorted(path.glob("data-*.val"))
    assert len(keys) == 1 and len(vals) == 1, (keys, vals)
    return keys[0], vals[0]


def assert_holds(db: kvstore.Store, expected: dict[bytes, bytes]) -> None:
    assert len(db) == len(expected)
    assert set(db) == set(expected)
    for key, value in expected.items():
        assert db[key] == value
    for i in range(15):  # every key the operations ever touched
        if k(i) not in expected:
            assert k(i) not in db
            with pytest.raises(KeyError):
                db[k(i)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store OPS builds, closed cleanly; its files checked against the layout."""
    path = tmp_path_factory.mktemp("pristine") / "store"
    with kvstore.open(path) as db:
        for op in OPS:
            if op.value is None:
                del db[op.key]
            else:
                db[op.key] = op.value
    key_file, val_file = data_pair(path)
    kb, vb = key_file.read_bytes(), val_file.read_bytes()
    assert len(kb) == KEY_SIZE_BYTES and len(vb) == VAL_SIZE
    for i, (op, off, pos) in enumerate(zip(OPS, OFFSETS, POSITIONS, strict=True)):
        rec_key, rec_off = struct.unpack_from("<16sq", kb, HEADER + KREC * i)
        assert rec_key == op.key
        assert rec_off == (-1 if off is None else off)
        assert vb[pos : pos + record_size(op)] == record(op.key, op.value)
    return path


def torn_copy(pristine: Path, dest: Path, which: str, t: int) -> tuple[Path, bytes]:
    """Copy the store to dest, cut its KEY or VAL file to t bytes; return (file, its bytes)."""
    shutil.copytree(pristine, dest)
    key_file, val_file = data_pair(dest)
    target = key_file if which == "key" else val_file
    os.truncate(target, t)
    return target, target.read_bytes()


# The cut positions: every byte within the last 3 KEY records, and within the last 4 VAL records.
KEY_CUTS = range(KEY_SIZE_BYTES - 3 * KREC, KEY_SIZE_BYTES + 1)
VAL_CUTS = range(POSITIONS[-4], VAL_SIZE + 1)


def expected_kept(which: str, t: int) -> int:
    """Operations an open keeps: a KEY file cut short loses none (VAL names every record,
    and the open writes the missing KEY records from it); a cut VAL loses from the
    first record it cut."""
    return len(OPS) if which == "key" else kept_after_val_cut(t)


class TestTornTail:
    def test_cut_ranges_cover_tombstones_and_empty_values(self) -> None:
        key_ops = {kept_after_key_cut(t) for t in KEY_CUTS}
        assert key_ops == {27, 28, 29, 30}
        assert any(OPS[i].value is None for i in range(27, 30))
        val_ops = {kept_after_val_cut(t) for t in VAL_CUTS}
        assert val_ops == {26, 27, 28, 29, 30}
        assert any(op.value == b"" for op in OPS[min(val_ops) :])
        assert any(op.value is None for op in OPS[min(val_ops) :])

    @pytest.mark.parametrize("which", ["key", "val"])
    def test_writer_open_recovers_the_prefix_and_keeps_working(
        self, pristine: Path, tmp_path: Path, which: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        pristine_key = data_pair(pristine)[0].read_bytes()
        cuts = KEY_CUTS if which == "key" else VAL_CUTS
        for t in cuts:
            n = expected_kept(which, t)
            expected = state_after(OPS[:n])
            dest = tmp_path / f"{which}{t}"
            torn_copy(pristine, dest, which, t)
            torn_key, torn_val = (p.read_bytes() for p in data_pair(dest))
            key_end, val_end = HEADER + KREC * n, val_end_after(OPS, n)
            # What the open cuts: a KEY cut leaves a partial record at most (whole ones
            # are written again from VAL); a VAL cut, the records from the first it cut.
            cut_at = HEADER + KREC * kept_after_key_cut(t) if which == "key" else key_end
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="kvstore"), kvstore.open(dest) as db:
                assert_holds(db, expected)
                key_file, val_file = data_pair(dest)
                assert key_file.stat().st_size == key_end, f"cut {which} at {t}"
                assert val_file.stat().st_size == val_end, f"cut {which} at {t}"
                # New writes after recovery, including one to a key whose record was cut.
                db[k(100)] = b"after-recovery"
                db[k(13)] = b"rewritten"
                if k(1) in expected:
                    del db[k(1)]
            dropped = pristine_key[cut_at : t if which == "key" else None]
            if dropped:
                warned = [
                    r
                    for r in caplog.records
                    if r.name.startswith("kvstore") and r.levelno >= logging.WARNING
                ]
                assert warned, f"dropping records at cut {which}={t} was not logged"
            assert_recovered_exactly(
                dest, torn_key[cut_at:], torn_val[val_end:], cut_at, val_end, f"{which}={t}"
            )
            if which == "key":
                assert data_pair(dest)[0].read_bytes()[:key_end] == pristine_key
            expected2 = dict(expected)
            expected2[k(100)] = b"after-recovery"
            expected2[k(13)] = b"rewritten"
            expected2.pop(k(1), None)
            with kvstore.open(dest) as db:
                assert_holds(db, expected2)
                assert db.verify() == []
            with kvstore.open(dest, readonly=True) as ro:
                assert_holds(ro, expected2)
            shutil.rmtree(dest)

    @pytest.mark.parametrize("which", ["key", "val"])
    def test_readonly_open_ignores_the_torn_tail(
        self, pristine: Path, tmp_path: Path, which: str
    ) -> None:
        cuts = KEY_CUTS if which == "key" else VAL_CUTS
        for t in cuts:
            expected = state_after(OPS[: expected_kept(which, t)])
            dest = tmp_path / f"{which}{t}"
            target, torn = torn_copy(pristine, dest, which, t)
            other = data_pair(dest)[1 if which == "key" else 0]
            other_bytes = other.read_bytes()
            with kvstore.open(dest, readonly=True) as ro:
                assert_holds(ro, expected)
            assert target.read_bytes() == torn, "a readonly open changed a file"
            assert other.read_bytes() == other_bytes, "a readonly open changed a file"
            assert not (dest / "recovered").exists()
            shutil.rmtree(dest)


def set_offset(key_file: Path, record: int, offset: int) -> None:
    """Overwrite the VAL offset of KEY record ``record`` (FORMAT.md's layout)."""
    data = bytearray(key_file.read_bytes())
    struct.pack_into("<q", data, HEADER + KREC * record + 16, offset)
    key_file.write_bytes(bytes(data))


def build_store(path: Path, ops: list[Op]) -> None:
    with kvstore.open(path) as db:
        for op in ops:
            if op.value is None:
                del db[op.key]
            else:
                db[op.key] = op.value


# A value that carries a well-formed record inside it, 10 bytes in, k1's own: a KEY
# record pointing there passes the CRC and key checks, but is not where k1's record lies.
INNER = b"inner value"
CONTAINER = b"<" * 10 + record(k(1), INNER) + b">" * 10
OVERLAP_OPS = [Op(k(0), CONTAINER), Op(k(1), b"the real value of k1"), Op(k(2), b"c" * 30)]


class TestRecoveryRules:
    """FORMAT.md's rules for a KEY record that disagrees with its sound VAL record, each
    triggered alone: VAL says what the record was, so the open rewrites it from VAL
    (a writer in the file, saving the bytes it overwrote in recovered/; a read-only
    open in its view only) and keeps every record, the damaged one's included."""

    def check(self, dest: Path, ops: list[Op], n: int, tail_check_bytes: int,
              original_key: bytes) -> None:
        expected = state_after(ops)
        before = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
        with kvstore.open(dest, readonly=True, tail_check_bytes=tail_check_bytes) as ro:
            assert {key: ro[key] for key in ro} == expected
            assert ro.recovery is not None and ro.recovery.tail is None
            assert ro.recovery.mended is not None and ro.recovery.mended.records == 1
        assert {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()} == before
        assert not (dest / "recovered").exists()
        damaged_key, val_bytes = (p.read_bytes() for p in data_pair(dest))
        at = HEADER + KREC * n
        with kvstore.open(dest, tail_check_bytes=tail_check_bytes) as db:
            assert {key: db[key] for key in db} == expected
            rec = db.recovery
            assert rec is not None and rec.tail is None and rec.truncated
            assert rec.mended is not None and rec.mended.key_offset == at
        key_file, val_file = data_pair(dest)
        assert key_file.read_bytes() == original_key  # rewritten exactly as it was
        assert val_file.read_bytes() == val_bytes
        saved = list((dest / "recovered").iterdir())
        assert [p.name for p in saved] == [f"gen000001-{saved[0].name[10:35]}-mended-at{at}.key"]
        assert saved[0].read_bytes() == damaged_key[at : at + KREC]
        with kvstore.open(dest) as db:
            assert {key: db[key] for key in db} == expected
            assert db.verify() == [] and db.recovery is None

    # Record 10 is a put in the middle of the file. With tail_check_bytes=1 only the
    # last record's value is checked, so nothing but the offset rule can catch it.
    @pytest.mark.parametrize("tail_check_bytes", [1, kvstore.DEFAULT_TAIL_CHECK_BYTES])
    @pytest.mark.parametrize("offset", [0, 8, HEADER - 1, -2, -(2**63)])
    def test_offset_below_the_header(
        self, pristine: Path, tmp_path: Path, offset: int, tail_check_bytes: int
    ) -> None:
        assert OPS[10].value is not None
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        set_offset(data_pair(dest)[0], 10, offset)
        self.check(dest, OPS, 10, tail_check_bytes, data_pair(pristine)[0].read_bytes())

    @pytest.mark.parametrize("record", [24, 29])
    def test_value_at_an_earlier_record(self, pristine: Path, tmp_path: Path, record: int) -> None:
        """The record points at the previous put's value: a sound record, CRC and all,
        of another key, and not where its own record lies."""
        earlier = max(i for i in range(record) if OPS[i].value is not None)
        offset = OFFSETS[earlier]
        assert OPS[record].value is not None and offset is not None
        assert OPS[record].key != OPS[earlier].key
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        set_offset(data_pair(dest)[0], record, offset)
        self.check(dest, OPS, record, kvstore.DEFAULT_TAIL_CHECK_BYTES,
                   data_pair(pristine)[0].read_bytes())

    def test_value_inside_the_previous_record(self, tmp_path: Path) -> None:
        dest = tmp_path / "store"
        build_store(dest, OVERLAP_OPS)
        inner = HEADER + VHDR + 10
        _, val_file = data_pair(dest)
        assert val_file.read_bytes()[inner + VHDR : inner + VHDR + len(INNER)] == INNER
        original = data_pair(dest)[0].read_bytes()
        set_offset(data_pair(dest)[0], 1, inner)
        self.check(dest, OVERLAP_OPS, 1, kvstore.DEFAULT_TAIL_CHECK_BYTES, original)


def flip(path: Path, byte: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(byte)
        b = f.read(1)[0]
        f.seek(byte)
        f.write(bytes([b ^ (1 << bit)]))


# The bit-flip store: 40 keys written once each (so each VAL record has exactly one
# KEY record), then 16 KiB of later records, so the damaged one is well outside the
# VAL tail that open checks when tail_check_bytes is small.
FLIP_KEYS = [k(f"flip{i}") for i in range(40)]
FLIP_VALS = [val(i, 24 + i) for i in range(40)]
FILLER = [(k(f"fill{i}"), val(i, 1000)) for i in range(16)]
VICTIM = 7
TAIL = 4096


@pytest.fixture(scope="module")
def flip_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, bytes], int]:
    """(store path, its full contents, VAL offset of the victim's record)."""
    path = tmp_path_factory.mktemp("flips") / "store"
    with kvstore.open(path) as db:
        for key, value in zip(FLIP_KEYS, FLIP_VALS, strict=True):
            db[key] = value
        for key, value in FILLER:
            db[key] = value
    contents = dict(zip(FLIP_KEYS, FLIP_VALS, strict=True)) | dict(FILLER)
    offset = HEADER + sum(VHDR + len(x) for x in FLIP_VALS[:VICTIM])
    _, val_file = data_pair(path)
    vb = val_file.read_bytes()
    assert vb[offset + VHDR : offset + VHDR + len(FLIP_VALS[VICTIM])] == FLIP_VALS[VICTIM]
    assert len(vb) - offset > 3 * TAIL
    return path, contents, offset


def assert_only_victim_damaged(
    db: kvstore.Store, contents: dict[bytes, bytes], offset: int, what: str
) -> None:
    victim = FLIP_KEYS[VICTIM]
    damage = db.verify()
    assert len(damage) == 1, f"{what}: {damage}"
    assert damage[0].key == victim, what
    assert damage[0].offset == offset, what
    assert isinstance(damage[0].reason, str) and damage[0].reason
    with pytest.raises(CorruptStoreError):
        db[victim]
    with pytest.raises(CorruptStoreError):
        db.get(victim)
    assert len(db) == len(contents)
    for key, value in contents.items():
        if key != victim:
            assert db[key] == value, what


class TestBitFlips:
    def test_every_bit_of_a_value_and_its_record_header(
        self, flip_store: tuple[Path, dict[bytes, bytes], int], tmp_path: Path
    ) -> None:
        src, contents, offset = flip_store
        dest = tmp_path / "store"
        shutil.copytree(src, dest)
        _, val_file = data_pair(dest)
        pristine = val_file.read_bytes()
        end = offset + VHDR + len(FLIP_VALS[VICTIM])
        for byte in range(offset, end):  # length, crc, key, then every value byte
            for bit in range(8):
                flip(val_file, byte, bit)
                what = f"VAL byte {byte - offset} of the record, bit {bit}"
                with kvstore.open(dest, readonly=True, tail_check_bytes=TAIL) as ro:
                    assert_only_victim_damaged(ro, contents, offset, what)
                flip(val_file, byte, bit)
        assert val_file.read_bytes() == pristine

    @pytest.mark.parametrize("where", ["length", "crc", "value"])
    def test_writer_open_with_damaged_record(
        self, flip_store: tuple[Path, dict[bytes, bytes], int], tmp_path: Path, where: str
    ) -> None:
        src, contents, offset = flip_store
        dest = tmp_path / "store"
        shutil.copytree(src, dest)
        _, val_file = data_pair(dest)
        byte = {"length": offset + 1, "crc": offset + 6, "value": offset + VHDR + 3}[where]
        flip(val_file, byte, 5)
        with kvstore.open(dest, tail_check_bytes=TAIL) as db:
            assert_only_victim_damaged(db, contents, offset, where)
            db[k("new")] = b"new"
        with kvstore.open(dest, tail_check_bytes=TAIL) as db:
            assert_only_victim_damaged(db, contents | {k("new"): b"new"}, offset, where)
            # Overwriting the damaged key makes it readable again.
            db[FLIP_KEYS[VICTIM]] = b"healed"
            assert db[FLIP_KEYS[VICTIM]] == b"healed"

    @pytest.mark.parametrize("readonly", [False, True])
    def test_damage_in_the_tail_before_sound_records_is_kept_in_place(
        self, flip_store: tuple[Path, dict[bytes, bytes], int], tmp_path: Path, readonly: bool
    ) -> None:
        """A damaged value with sound records after it is damage in the middle, not a
        torn tail: the open keeps it (a get raises, verify names it) and every record
        after it, and cuts nothing."""
        src, contents, _ = flip_store
        dest = tmp_path / "store"
        shutil.copytree(src, dest)
        as_after_a_crash(dest)
        _, val_file = data_pair(dest)
        size = val_file.stat().st_size
        third_last = size - 3 * (VHDR + 1000)
        flip(val_file, third_last + VHDR + 500, 0)
        victim = FILLER[-3][0]
        with kvstore.open(dest, readonly=readonly, tail_check_bytes=2 * TAIL) as db:
            rec = db.recovery
            assert rec is not None and rec.tail is None
            assert rec.mended is not None and rec.mended.kept_damaged == 1
            assert len(db) == len(contents)
            for key, value in contents.items():
                if key != victim:
                    assert db[key] == value
            with pytest.raises(CorruptStoreError):
                db[victim]
            assert [d.key for d in db.verify()] == [victim]
        assert not (dest / "recovered").exists()
        assert val_file.stat().st_size == size

    @pytest.mark.parametrize("readonly", [False, True])
    def test_damage_in_the_last_record_is_a_torn_tail(
        self, flip_store: tuple[Path, dict[bytes, bytes], int], tmp_path: Path, readonly: bool
    ) -> None:
        """Nothing sound after the damaged record: it is what a torn write leaves, cut."""
        src, contents, _ = flip_store
        dest = tmp_path / "store"
        shutil.copytree(src, dest)
        as_after_a_crash(dest)
        _, val_file = data_pair(dest)
        size = val_file.stat().st_size
        flip(val_file, size - 500, 0)
        expected = dict(zip(FLIP_KEYS, FLIP_VALS, strict=True)) | dict(FILLER[:-1])
        with kvstore.open(dest, readonly=readonly, tail_check_bytes=2 * TAIL) as db:
            assert {key: db[key] for key in db} == expected
            assert FILLER[-1][0] not in db
        if not readonly:
            with kvstore.open(dest) as db:
                assert db.verify() == []
                assert len(db) == len(expected)
                db[FILLER[-1][0]] = b"again"
            with kvstore.open(dest, readonly=True) as ro:
                assert ro[FILLER[-1][0]] == b"again"
                assert ro.verify() == []


class TestBadHeaders:
    @pytest.mark.parametrize("which", ["key", "val"])
    def test_bit_flips_in_magic_are_refused(
        self, pristine: Path, tmp_path: Path, which: str
    ) -> None:
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        target = data_pair(dest)[0 if which == "key" else 1]
        before = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
        for byte in range(8):
            for bit in range(8):
                flip(target, byte, bit)
                for readonly in (False, True):
                    with pytest.raises(CorruptStoreError) as info:
                        kvstore.open(dest, readonly=readonly)
                    assert not isinstance(info.value, UnsupportedVersionError)
                    assert Path(info.value.path).name == target.name
                flip(target, byte, bit)
        after = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
        assert after == before, "a refused open changed the store"
        # A refused writer open released its lock: the repaired store opens for writing.
        with kvstore.open(dest) as db:
            assert_holds(db, state_after(OPS))

    @pytest.mark.parametrize("which", ["key", "val"])
    def test_bit_flips_in_version_read_as_a_damaged_header(
        self, pristine: Path, tmp_path: Path, which: str
    ) -> None:
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        target = data_pair(dest)[0 if which == "key" else 1]
        for bit in range(32):
            flip(target, 8 + bit // 8, bit % 8)
            for readonly in (False, True):
                with pytest.raises(CorruptStoreError) as info:
                    kvstore.open(dest, readonly=readonly)
                # The header checksum catches the flip: never mistaken for a newer format.
                assert not isinstance(info.value, UnsupportedVersionError), bit
                assert "damaged header" in str(info.value), bit
            flip(target, 8 + bit // 8, bit % 8)
        with kvstore.open(dest) as db:
            assert_holds(db, state_after(OPS))

    @pytest.mark.parametrize("which", ["key", "val"])
    @pytest.mark.parametrize("readonly", [False, True])
    def test_version_99_is_unsupported(
        self, pristine: Path, tmp_path: Path, which: str, readonly: bool
    ) -> None:
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        target = data_pair(dest)[0 if which == "key" else 1]
        data = bytearray(target.read_bytes())
        struct.pack_into("<I", data, 8, 99)
        # FORMAT.md: the checksum is the CRC32 of header bytes 0..11 and 16..23.
        checksum = zlib.crc32(bytes(data[16:24]), zlib.crc32(bytes(data[:12])))
        struct.pack_into("<I", data, 12, checksum)
        target.write_bytes(bytes(data))
        with pytest.raises(UnsupportedVersionError) as info:
            kvstore.open(dest, readonly=readonly)
        assert isinstance(info.value, CorruptStoreError)
        assert Path(info.value.path).name == target.name
        assert target.read_bytes() == bytes(data)

    @pytest.mark.parametrize("readonly", [False, True])
    def test_path_that_is_a_regular_file(self, tmp_path: Path, readonly: bool) -> None:
        path = tmp_path / "file"
        path.write_bytes(b"KVSTKEY\n" + bytes(100))
        with pytest.raises(NotAStoreError):
            kvstore.open(path, readonly=readonly)


# Permission checks run in a child for which file modes hold (see conftest.py).
PERMISSION_CHILD = r"""
import os, sys
probe, store, readonly = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
try:
    if os.path.isdir(probe):
        os.listdir(probe)
    else:
        open(probe, "rb").close()
    print("PERMISSIONS-NOT-ENFORCED")
    sys.exit(0)
except PermissionError:
    pass
import kvstore
from kvstore.exceptions import StorePermissionError
try:
    kvstore.open(store, readonly=readonly).close()
    print("OPENED")
except StorePermissionError:
    print("StorePermissionError")
except BaseException as exc:
    print("OTHER", repr(exc))
"""


class TestPermissions:
    @pytest.mark.parametrize("readonly", [False, True])
    @pytest.mark.parametrize("what", ["directory", "val-file", "key-file"])
    def test_no_permission(
        self,
        pristine: Path,
        tmp_path: Path,
        unprivileged_child: Callable[..., subprocess.CompletedProcess[str]],
        what: str,
        readonly: bool,
    ) -> None:
        dest = tmp_path / "store"
        shutil.copytree(pristine, dest)
        key_file, val_file = data_pair(dest)
        target = {"directory": dest, "val-file": val_file, "key-file": key_file}[what]
        target.chmod(0)
        try:
            out = unprivileged_child(
                PERMISSION_CHILD, str(target), str(dest), "1" if readonly else "0"
            )
        finally:
            target.chmod(0o755 if what == "directory" else 0o644)
        assert out.returncode == 0, out.stderr
        if out.stdout.strip() == "PERMISSIONS-NOT-ENFORCED":
            pytest.skip("this environment cannot drop the capabilities that bypass file modes")
        assert out.stdout.strip() == "StorePermissionError", out.stdout + out.stderr
        with kvstore.open(dest) as db:
            assert_holds(db, state_after(OPS))
