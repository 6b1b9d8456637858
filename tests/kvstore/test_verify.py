"""verify tells the truth; a damaged header reads as damage; an open holds one chunk at a time.

Expected offsets and sizes come from the layout in docs/FORMAT.md (24-byte
headers, 24-byte KEY records, 24-byte value record headers), never from the
store. A read-only open's view is point in time; what it leaves out is logged
and reported, and verify reports every damaged record wherever it is.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tracemalloc
import weakref
import zlib
from pathlib import Path

import numpy as np
import pytest
from after_crash import as_after_a_crash

import kvstore
from kvstore import _datafiles, _recovery, cli
from kvstore.exceptions import CorruptStoreError, UnsupportedVersionError

HEADER = 24
KREC = 24
VHDR = 24  # FORMAT.md, format 3: u32 length, u32 CRC, the key


def k(i: int | str) -> bytes:
    return kvstore.md5_key(str(i))


def value(i: int) -> bytes:
    return b"value-%05d" % i


def data_pair(path: Path) -> tuple[Path, Path]:
    keys = sorted(path.glob("data-*.key"))
    vals = sorted(path.glob("data-*.val"))
    assert len(keys) == 1 and len(vals) == 1, (keys, vals)
    return keys[0], vals[0]


def flip(path: Path, byte: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(byte)
        b = f.read(1)[0]
        f.seek(byte)
        f.write(bytes([b ^ mask]))


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def header_checksum(header: bytes) -> int:
    """FORMAT.md, version 2: CRC32 of header bytes 0..11 followed by 16..23."""
    return zlib.crc32(header[16:24], zlib.crc32(header[:12]))


def build(path: Path, n: int) -> None:
    """n puts, key k(i) -> value(i), in order: record i's value is at val_offset(i)."""
    with kvstore.open(path) as db:
        for i in range(n):
            db[k(i)] = value(i)


def val_offset(i: int) -> int:
    return HEADER + sum(VHDR + len(value(j)) for j in range(i))


def key_offset(i: int) -> int:
    return HEADER + KREC * i


def run_verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    status = cli.main(["verify", str(path)])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


@pytest.fixture(scope="module")
def store5000(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("s5000") / "store"
    build(path, 5000)
    _, val_file = data_pair(path)
    assert val_file.stat().st_size == val_offset(5000)
    return path


@pytest.fixture
def copy5000(store5000: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(store5000, dest)
    return dest


class TestReportedCases:
    """The two cases from issue 12: both printed 'ok' and exited 0."""

    def test_flipped_byte_in_the_last_value_of_5000_records(
        self, copy5000: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, val_file = data_pair(copy5000)
        flip(val_file, val_offset(4999) + VHDR + 3)
        as_after_a_crash(copy5000)
        before = snapshot(copy5000)
        status, out, err = run_verify(copy5000, capsys)
        assert status == 1
        assert out[0] == (
            f"damaged: key {k(4999).hex()} offset {val_offset(4999)}: CRC mismatch "
            f"(KEY record at offset {key_offset(4999)})"
        )
        assert out[1].startswith(
            f"torn tail: a writable open would cut 1 KEY record from KEY offset "
            f"{key_offset(4999)} and {VHDR + len(value(4999))} VAL bytes from VAL offset "
            f"{val_offset(4999)}; first unsound record: "
        )
        assert len(out) == 2
        assert err.endswith(
            f"kvstore: error: {copy5000}: 1 damaged record of 5000 checked; "
            "a writable open would cut 1 record\n"
        )
        assert snapshot(copy5000) == before, "verify changed the store"
        with kvstore.open(copy5000, readonly=True) as ro:
            assert ro.verify() == [
                kvstore.Damage(k(4999), val_offset(4999), "CRC mismatch", key_offset(4999))
            ]

    def test_one_record_store(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = tmp_path / "store"
        build(path, 1)
        _, val_file = data_pair(path)
        flip(val_file, HEADER + VHDR)
        # Closed cleanly: an open uses the saved index and cuts nothing (rot, not a tear).
        status, out, err = run_verify(path, capsys)
        assert status == 1 and len(out) == 1
        assert out[0].startswith(f"damaged: key {k(0).hex()} offset {HEADER}: CRC mismatch")
        assert err.endswith(": 1 damaged record of 1 checked\n")
        as_after_a_crash(path)
        status, out, err = run_verify(path, capsys)
        assert status == 1
        assert out[0].startswith(f"damaged: key {k(0).hex()} offset {HEADER}: CRC mismatch")
        assert out[1].startswith(
            f"torn tail: a writable open would cut 1 KEY record from KEY offset {HEADER} "
        )
        assert err.endswith(": 1 damaged record of 1 checked; a writable open would cut 1 record\n")

    def test_clean_store_is_ok(self, store5000: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert run_verify(store5000, capsys) == (0, ["ok: 5000 records checked"], "")


class TestDamageAnywhere:
    def test_flip_in_the_middle_outside_the_checked_tail(self, copy5000: Path) -> None:
        _, val_file = data_pair(copy5000)
        flip(val_file, val_offset(2500) + VHDR)
        with kvstore.open(copy5000, readonly=True, tail_check_bytes=4096) as ro:
            assert ro.recovery is None  # outside the checked tail: open keeps it
            report = ro.verify_report()
            assert report.records == 5000
            assert report.damages == [
                kvstore.Damage(k(2500), val_offset(2500), "CRC mismatch", key_offset(2500))
            ]
            assert report.torn_tail is None
            assert not report.ok
            with pytest.raises(CorruptStoreError):
                ro[k(2500)]

    def test_flip_in_the_middle_inside_the_checked_tail(
        self, copy5000: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # All 5000 values lie in the default 1 MiB tail; sound records follow the damaged
        # one, so it is damage in the middle: an open keeps it in place and cuts nothing.
        _, val_file = data_pair(copy5000)
        flip(val_file, val_offset(2500) + VHDR)
        as_after_a_crash(copy5000)  # else the open uses the saved index: no scan, no mend
        status, out, _ = run_verify(copy5000, capsys)
        assert status == 1
        assert out[0].startswith(f"damaged: key {k(2500).hex()} offset {val_offset(2500)}: ")
        assert out[1] == (
            "mend: on a writable open, 1 damaged record left in place for verify and repair "
            "(sound records follow)"
        )
        assert not any(line.startswith("torn tail:") for line in out)

    def test_every_damaged_record_is_listed(self, copy5000: Path) -> None:
        key_file, val_file = data_pair(copy5000)
        flip(val_file, val_offset(10) + VHDR + 1)  # a value byte
        flip(val_file, val_offset(3000) + 5)  # its CRC
        flip(val_file, val_offset(4999) + 1)  # its length: runs past the end
        with open(key_file, "r+b") as f:  # a KEY record pointing outside VAL
            f.seek(key_offset(4000) + 16)
            f.write(struct.pack("<q", val_offset(5000) + 100))
        with kvstore.open(copy5000, readonly=True) as ro:
            damages = ro.verify()
        assert [(d.key, d.offset, d.key_offset) for d in damages] == [
            (k(10), val_offset(10), key_offset(10)),
            (k(3000), val_offset(3000), key_offset(3000)),
            (k(4000), val_offset(5000) + 100, key_offset(4000)),
            (k(4999), val_offset(4999), key_offset(4999)),
        ]
        assert [d.reason for d in damages] == [
            "CRC mismatch",
            "CRC mismatch",
            "offset outside the VAL file",
            f"value length {len(value(4999)) + 256} runs past the end of the VAL file",
        ]

    def test_verify_of_a_writer_sees_what_it_wrote_and_stays_clean(self, tmp_path: Path) -> None:
        with kvstore.open(tmp_path / "store") as db:
            db[k(1)] = b"one"
            del db[k(1)]
            db[k(2)] = b""
            report = db.verify_report()  # flushes first
            assert (report.records, report.damages, report.torn_tail) == (3, [], None)
            assert report.ok

    def test_readonly_verify_after_a_compaction_replaced_its_files(self, copy5000: Path) -> None:
        with kvstore.open(copy5000, readonly=True) as ro:
            with kvstore.open(copy5000) as db:
                for i in range(100):
                    del db[k(i)]
                db.compact()
            report = ro.verify_report()  # the old generation, through the open files
        # The deletes were flushed into the old generation before it was compacted.
        assert (report.records, report.damages, report.torn_tail) == (5100, [], None)


class TestTornTail:
    def test_interrupted_append_is_reported_and_is_what_a_writer_cuts(
        self, copy5000: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        key_file, val_file = data_pair(copy5000)
        partial = k("torn") + b"\x01\x02"  # 18 bytes of a KEY record
        orphan = struct.pack("<II", 5, zlib.crc32(b"hello")) + b"hello"
        with open(val_file, "ab") as f:
            f.write(orphan)
        with open(key_file, "ab") as f:
            f.write(partial)
        expected = _recovery.TornTail(
            key_offset=key_offset(5000),
            key_records=0,
            tombstones=0,
            key_bytes=len(partial),
            val_offset=val_offset(5000),
            val_bytes=len(orphan),
            reason="",
        )
        with kvstore.open(copy5000, readonly=True) as ro:
            assert ro.recovery == _recovery.Recovery(expected, truncated=False, saved=())
            report = ro.verify_report()
        assert report.torn_tail == expected
        assert report.damages == [] and report.ok
        status, out, _ = run_verify(copy5000, capsys)
        assert status == 0  # an interrupted append: no complete record is lost
        assert out == [
            f"torn tail: a writable open would cut {len(partial)} bytes of a partial KEY record "
            f"at KEY offset {key_offset(5000)} and {len(orphan)} VAL bytes from VAL offset "
            f"{val_offset(5000)}",
            "ok: 5000 records checked",
        ]
        with kvstore.open(copy5000) as db:
            assert db.recovery is not None and db.recovery.tail == expected
            assert db.recovery.truncated
            saved = sorted(Path(p).read_bytes() for p in db.recovery.saved)
            assert saved == sorted([partial, orphan])
            assert key_file.stat().st_size == key_offset(5000)
            assert val_file.stat().st_size == val_offset(5000)
            assert len(db) == 5000

    def test_records_past_the_val_end_are_damage_and_cut(
        self, copy5000: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, val_file = data_pair(copy5000)
        os.truncate(val_file, val_offset(4997) + 4)  # mid-header of record 4997
        with kvstore.open(copy5000, readonly=True) as ro:
            report = ro.verify_report()
        assert [d.key for d in report.damages] == [k(4997), k(4998), k(4999)]
        assert {d.reason for d in report.damages} == {"offset outside the VAL file"}
        assert report.torn_tail == _recovery.TornTail(
            key_offset=key_offset(4997),
            key_records=3,
            tombstones=0,
            key_bytes=3 * KREC,
            val_offset=val_offset(4997),
            val_bytes=4,
            reason=report.torn_tail.reason if report.torn_tail else "",
        )
        assert report.torn_tail is not None
        assert f"KEY record at offset {key_offset(4997)}" in report.torn_tail.reason
        assert run_verify(copy5000, capsys)[0] == 1
        with kvstore.open(copy5000) as db:  # a writer cuts exactly what verify said
            assert db.recovery is not None and db.recovery.tail == report.torn_tail
            assert len(db) == 4997
            assert db.verify_report().ok


class TestOpenNeverDropsSilently:
    def test_readonly_open_warns_and_reports_what_it_leaves_out(
        self, copy5000: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        _, val_file = data_pair(copy5000)
        flip(val_file, val_offset(4999) + VHDR + 3)
        as_after_a_crash(copy5000)
        before = snapshot(copy5000)
        with caplog.at_level(logging.INFO, logger="kvstore"):
            ro = kvstore.open(copy5000, readonly=True)
        with ro:
            assert len(ro) == 4999 and k(4999) not in ro
            rec = ro.recovery
            assert rec is not None and not rec.truncated and rec.saved == ()
            assert (rec.tail.key_records, rec.tail.key_offset, rec.tail.val_offset) == (
                1,
                key_offset(4999),
                val_offset(4999),
            )
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1
        assert "read-only open leaves out 1 KEY record from KEY offset " in warnings[0]
        assert f"{key_offset(4999)}" in warnings[0] and f"{val_offset(4999)}" in warnings[0]
        assert k(4999).hex() in warnings[0] and "CRC mismatch" in warnings[0]
        assert snapshot(copy5000) == before

    def test_writer_open_logs_counts_and_recovered_files(
        self, copy5000: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        key_file, val_file = data_pair(copy5000)
        flip(val_file, val_offset(4998) + VHDR)  # the last two: nothing sound follows
        flip(val_file, val_offset(4999) + VHDR)
        as_after_a_crash(copy5000)
        cut_keys = key_file.read_bytes()[key_offset(4998) :]
        cut_vals = val_file.read_bytes()[val_offset(4998) :]
        with caplog.at_level(logging.INFO, logger="kvstore"):
            db = kvstore.open(copy5000)
        with db:
            rec = db.recovery
            assert rec is not None and rec.truncated
            assert (rec.tail.key_records, rec.tail.key_bytes, rec.tail.val_bytes) == (
                2,
                2 * KREC,
                len(cut_vals),
            )
            assert sorted(Path(p).read_bytes() for p in rec.saved) == sorted([cut_keys, cut_vals])
            assert all(Path(p).parent == copy5000 / "recovered" for p in rec.saved)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1
        assert "recovery cut 2 KEY records from KEY offset" in warnings[0]
        for p in rec.saved:
            assert p in warnings[0]
        with kvstore.open(copy5000) as again:
            assert again.recovery is None  # nothing left to cut

    def test_a_tombstone_after_a_damaged_record_is_not_undone_silently(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
    ) -> None:
        path = tmp_path / "store"
        with kvstore.open(path) as db:
            for i in range(10):
                db[k(i)] = value(i)
            del db[k(3)]  # record 10: the tombstone the cut would take with it
        _, val_file = data_pair(path)
        flip(val_file, val_offset(9) + VHDR)  # record 9, before the tombstone
        as_after_a_crash(path)
        with caplog.at_level(logging.WARNING, logger="kvstore"):
            ro = kvstore.open(path, readonly=True)
        with ro:
            # Point in time: before record 9, key 3 still existed. Said so, not silent:
            assert k(3) in ro
            assert ro.recovery is not None
            assert (ro.recovery.tail.key_records, ro.recovery.tail.tombstones) == (2, 1)
        assert "2 KEY records (including 1 tombstone)" in caplog.records[0].getMessage()
        status, out, _ = run_verify(path, capsys)
        assert status == 1
        assert out[0].startswith(f"damaged: key {k(9).hex()} offset {val_offset(9)}: ")
        assert "2 KEY records (including 1 tombstone)" in out[1]


def v2_header(magic: bytes, gen: int, version: int = 3) -> bytes:
    """A file header with a checksum (format 2 on; FORMAT.md)."""
    head = struct.pack("<8sI", magic, version)
    tail = struct.pack("<Q", gen)
    return head + struct.pack("<I", zlib.crc32(tail, zlib.crc32(head))) + tail


class TestHeaders:
    FIELDS = {"magic": range(0, 8), "version": range(8, 12), "checksum": range(12, 16),
              "generation": range(16, 24)}  # fmt: skip

    def test_new_files_are_version_3_with_a_checksum(self, store5000: Path) -> None:
        key_file, val_file = data_pair(store5000)
        assert key_file.read_bytes()[:HEADER] == v2_header(b"KVSTKEY\n", 1)
        assert val_file.read_bytes()[:HEADER] == v2_header(b"KVSTVAL\n", 1)

    @pytest.mark.parametrize("which", ["key", "val"])
    @pytest.mark.parametrize("field", list(FIELDS))
    def test_a_flipped_byte_in_any_field_is_a_damaged_header(
        self,
        tmp_path: Path,
        which: str,
        field: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        path = tmp_path / "store"
        build(path, 3)
        target = data_pair(path)[0 if which == "key" else 1]
        before = snapshot(path)
        for byte in self.FIELDS[field]:
            for mask in (0x01, 0x80, 0xFF):
                flip(target, byte, mask)
                for readonly in (False, True):
                    with pytest.raises(CorruptStoreError) as info:
                        kvstore.open(path, readonly=readonly)
                    what = f"{which} byte {byte} ^ {mask:#x}"
                    assert not isinstance(info.value, UnsupportedVersionError), what
                    message = str(info.value)
                    assert "damaged header" in message and "newer" not in message, what
                    assert f"{which.upper()} file" in message, what
                    assert info.value.path == str(target), what
                    assert "backup" in message and "dump" in message, what
                status, out, err = run_verify(path, capsys)
                assert (status, out) == (1, [])
                assert err.startswith("kvstore: error: ") and "damaged header" in err
                flip(target, byte, mask)
        assert snapshot(path) == before
        with kvstore.open(path) as db:
            assert db[k(2)] == value(2)

    @pytest.mark.parametrize("which", ["key", "val"])
    def test_a_newer_version_with_a_valid_checksum_is_unsupported(
        self, tmp_path: Path, which: str
    ) -> None:
        path = tmp_path / "store"
        build(path, 3)
        target = data_pair(path)[0 if which == "key" else 1]
        data = target.read_bytes()
        target.write_bytes(v2_header(data[:8], 1, version=4) + data[HEADER:])
        for readonly in (False, True):
            with pytest.raises(UnsupportedVersionError) as info:
                kvstore.open(path, readonly=readonly)
            assert "format version 4 is newer than this kvstore reads (3); upgrade" in str(
                info.value
            )

    def write_v1_store(self, path: Path) -> dict[bytes, bytes]:
        """A store laid out by hand as format version 1: no header checksum."""
        path.mkdir()
        puts = [(k("a"), b"apple"), (k("b"), b""), (k("c"), b"cherry"), (k("a"), b"apricot")]
        vals = bytearray(struct.pack("<8sIIQ", b"KVSTVAL\n", 1, 0, 1))
        keys = bytearray(struct.pack("<8sIIQ", b"KVSTKEY\n", 1, 0, 1))
        for key, val in puts:
            keys += key + struct.pack("<q", len(vals))
            vals += struct.pack("<II", len(val), zlib.crc32(val)) + val
        keys += k("c") + struct.pack("<q", -1)
        (path / "data-000001.key").write_bytes(bytes(keys))
        (path / "data-000001.val").write_bytes(bytes(vals))
        return {k("a"): b"apricot", k("b"): b""}

    def test_a_version_1_store_opens_and_keeps_working(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        expected = self.write_v1_store(path)
        v1_key = (path / "data-000001.key").read_bytes()[:HEADER]
        with kvstore.open(path, readonly=True) as ro:
            assert dict(ro.items()) == expected and ro.recovery is None
            assert ro.verify_report().ok
        with kvstore.open(path) as db:
            assert dict(db.items()) == expected
            db[k("d")] = b"date"
        expected[k("d")] = b"date"
        assert (path / "data-000001.key").read_bytes()[:HEADER] == v1_key  # not rewritten
        with kvstore.open(path) as db:
            assert dict(db.items()) == expected
            assert db.verify_report().ok
            db.compact()  # the new generation is written as version 3
        key_file, val_file = data_pair(path)
        assert key_file.read_bytes()[:HEADER] == v2_header(b"KVSTKEY\n", 2)
        assert val_file.read_bytes()[:HEADER] == v2_header(b"KVSTVAL\n", 2)
        with kvstore.open(path, readonly=True) as ro:
            assert dict(ro.items()) == expected
            assert ro.verify_report().ok

    @pytest.mark.parametrize("byte", [8, 9, 11, 12, 13, 15])
    def test_a_flip_in_a_version_1_header_is_damage_too(self, tmp_path: Path, byte: int) -> None:
        path = tmp_path / "store"
        self.write_v1_store(path)
        flip(path / "data-000001.val", byte, 0x04)
        with pytest.raises(CorruptStoreError) as info:
            kvstore.open(path, readonly=True)
        assert not isinstance(info.value, UnsupportedVersionError)
        assert "damaged header in the VAL file" in str(info.value)

    def test_a_flip_in_a_version_1_generation_is_a_mismatch(self, tmp_path: Path) -> None:
        path = tmp_path / "store"
        self.write_v1_store(path)
        flip(path / "data-000001.key", 16, 0x02)
        with pytest.raises(CorruptStoreError, match="generation mismatch"):
            kvstore.open(path, readonly=True)


BIG_N = 20_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BIG_N puts of 8-byte values, then a tombstone for every 7th key."""
    path = tmp_path_factory.mktemp("big") / "store"
    with kvstore.open(path) as db:
        keys = [k(i) for i in range(BIG_N)]
        db.put_many(keys, [b"%08d" % i for i in range(BIG_N)])
        for i in range(0, BIG_N, 7):
            del db[keys[i]]
    return path


class TestChunkedOpen:
    """An open reads the KEY file in chunks and hands the index one chunk at a time."""

    N = BIG_N
    CHUNK = 1000

    def files(self, path: Path, readonly: bool = True) -> _datafiles.DataFiles:
        gen, _ = _datafiles.find_generation(str(path))
        assert gen is not None
        return _datafiles.DataFiles(str(path), gen, readonly=readonly)

    def test_load_and_chunks_hold_one_chunk_at_a_time(self, big: Path) -> None:
        key_file, _ = data_pair(big)
        file_bytes = key_file.stat().st_size
        chunk_bytes = self.CHUNK * KREC
        assert file_bytes > 20 * chunk_bytes
        files = self.files(big)
        try:
            tracemalloc.start()
            try:
                loaded = _recovery.load_records(
                    files, readonly=True, tail_check_bytes=1 << 20, chunk_records=self.CHUNK
                )
                scan_peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.reset_peak()
                refs: list[weakref.ref[np.ndarray]] = []
                parts: list[bytes] = []
                for chunk in loaded.chunks():
                    assert 0 < len(chunk) <= self.CHUNK
                    assert all(r() is None for r in refs), "an earlier chunk is still held"
                    refs.append(weakref.ref(chunk))
                    parts.append(zlib.crc32(chunk.data).to_bytes(4, "little"))  # no copy
                    del chunk
                chunks_peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        finally:
            files.close()
        assert loaded.records == (file_bytes - HEADER) // KREC and loaded.recovery is None
        assert len(refs) == -(-loaded.records // self.CHUNK)
        raw = key_file.read_bytes()[HEADER:]
        step = chunk_bytes
        assert parts == [
            zlib.crc32(raw[i : i + step]).to_bytes(4, "little") for i in range(0, len(raw), step)
        ]
        # Reading the KEY file whole would take 22 chunks; the scan's bound is 3
        # (a chunk, its put indices, a batch of Python ints), handing out chunks' 1.5.
        assert scan_peak < 3 * chunk_bytes, scan_peak
        assert chunks_peak < 1.5 * chunk_bytes, chunks_peak

    def test_chunks_stop_at_the_torn_tail(self, big: Path, tmp_path: Path) -> None:
        dest = tmp_path / "store"
        shutil.copytree(big, dest)
        _, val_file = data_pair(dest)
        size = val_file.stat().st_size
        flip(val_file, size - 2)  # the last put's value
        files = self.files(dest)
        try:
            loaded = _recovery.load_records(
                files, readonly=True, tail_check_bytes=1 << 20, chunk_records=self.CHUNK
            )
            n = sum(len(c) for c in loaded.chunks())
        finally:
            files.close()
        assert loaded.recovery is not None
        assert n == loaded.records
        assert loaded.recovery.tail.key_offset == HEADER + KREC * n

    def test_a_store_opened_in_small_chunks_holds_everything(
        self, big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(kvstore._store, "_OPEN_CHUNK", 256)
        with kvstore.open(big, readonly=True) as ro:
            assert len(ro) == self.N - len(range(0, self.N, 7))
            for i in (0, 1, 6, 7, 255, 256, 257, self.N - 1):
                assert (k(i) in ro) == (i % 7 != 0), i
                if i % 7:
                    assert ro[k(i)] == b"%08d" % i
