"""The index saved at a clean close: used only when it describes the files exactly."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from plain_format import write_plain_store

import kvstore
from kvstore import _indexfile


def k(i: int) -> bytes:
    return kvstore.md5_key(f"idx{i}")


def build(path: Path, n: int = 3000) -> dict[bytes, bytes]:
    """A closed store with overwrites and deletes (so the table has deleted slots)."""
    model: dict[bytes, bytes] = {}
    with kvstore.open(path) as db:
        for i in range(n):
            db[k(i)] = model[k(i)] = b"v%d" % i
        for i in range(0, n, 3):
            db[k(i)] = model[k(i)] = b"w%d" % i
        for i in range(0, n, 7):
            del db[k(i)]
            del model[k(i)]
    return model


def table_bytes(db: kvstore.Store) -> list[tuple[int, int, int, bytes, bytes]]:
    g = db._g
    assert g is not None
    return [(s.cap, s.live, s.deleted, bytes(s.kmv), bytes(s.vmv)) for s in g.index._segs]


def idx_file(path: Path) -> Path:
    (found,) = path.glob("data-*.idx")
    return found


def assert_content(db: kvstore.Store, model: dict[bytes, bytes]) -> None:
    assert len(db) == len(model)
    assert {key: db[key] for key in db} == model


def test_clean_close_saves_the_index_and_open_reads_it_back_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "s"
    model = build(path)
    with kvstore.open(path) as db:
        assert db.index_source == "saved"
        saved = table_bytes(db)
        assert_content(db, model)
    os.remove(idx_file(path))
    with kvstore.open(path, readonly=True) as db:
        assert db.index_source == "rebuilt"
        assert_content(db, model)
    with kvstore.open(path) as db:  # the rebuilt index is saved again at close
        assert db.index_source == "rebuilt"
    with kvstore.open(path) as db:
        assert db.index_source == "saved"
        assert_content(db, model)
    # What was saved is the table as it was, not an equivalent one.
    with kvstore.open(path) as db:
        again = table_bytes(db)
    with kvstore.open(path) as db:
        assert table_bytes(db) == again
    assert saved and again


def test_writes_after_the_save_make_it_stale_and_open_rebuilds(tmp_path: Path) -> None:
    """A writer that appended and then died (no clean close): the KEY file is longer
    than the stamp says, so the saved index (which lacks the new records) is not used."""
    path = tmp_path / "s"
    model = build(path)
    db = kvstore.open(path)
    assert db.index_source == "saved"
    db[k(10**6)] = model[k(10**6)] = b"after"
    del db[k(1)]
    del model[k(1)]
    db.flush()
    db.abandon()  # as a kill -9 after the flush: nothing more is written, no index saved
    with kvstore.open(path, readonly=True) as db:
        assert db.index_source == "rebuilt"
        assert_content(db, model)


def test_a_tombstone_only_tail_after_the_save_is_seen(tmp_path: Path) -> None:
    """Deletes alone change only the KEY file: the stamp's KEY length must catch them."""
    path = tmp_path / "s"
    model = build(path)
    db = kvstore.open(path)
    del db[k(2)]
    del model[k(2)]
    db.flush()
    db.abandon()
    with kvstore.open(path) as db:
        assert db.index_source == "rebuilt"
        assert k(2) not in db
        assert_content(db, model)


@pytest.mark.parametrize("where", ["header", "segment-table", "key-slots", "value-slots",
                                   "trailer"])
def test_a_damaged_index_file_is_never_used(tmp_path: Path, where: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    model = build(path)
    idx = idx_file(path)
    data = bytearray(idx.read_bytes())
    head = _indexfile._HEADER.size + _indexfile._HEADER_CRC.size
    table = head + 16 * _indexfile._SEGMENT.size
    pos = {"header": 20, "segment-table": head + 9, "key-slots": table + 5,
           "value-slots": len(data) - 40, "trailer": len(data) - 2}[where]
    data[pos] ^= 0x40
    idx.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="kvstore._indexfile"):
        with kvstore.open(path, readonly=True) as db:
            assert db.index_source == "rebuilt"
            assert_content(db, model)
    assert "saved index not used" in caplog.text


def test_truncated_or_empty_index_file_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s"
    model = build(path)
    idx = idx_file(path)
    full = idx.read_bytes()
    for size in (0, 10, 100, len(full) // 2, len(full) - 1):
        idx.write_bytes(full[:size])
        with kvstore.open(path, readonly=True) as db:
            assert db.index_source == "rebuilt"
            assert_content(db, model)


def test_an_index_from_another_store_of_the_same_shape_is_refused(tmp_path: Path) -> None:
    """Same generation, same file lengths, other contents: the tails' CRCs differ."""
    a, b = tmp_path / "a", tmp_path / "b"
    with kvstore.open(a) as db:
        for i in range(500):
            db[k(i)] = b"%05d" % i
    with kvstore.open(b) as db:
        for i in range(500):
            db[k(i + 10_000)] = b"%05d" % i
    assert os.path.getsize(next(a.glob("*.key"))) == os.path.getsize(next(b.glob("*.key")))
    shutil.copy(idx_file(a), idx_file(b))
    with kvstore.open(b, readonly=True) as db:
        assert db.index_source == "rebuilt"
        assert k(10_000) in db and k(0) not in db


def test_a_value_rotted_in_place_near_the_end_is_damage_not_a_torn_tail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A byte of the last put's value flipped after a clean close, then tombstones after
    it (as a crawl leaves its stores): the files have the lengths and KEY tail that the
    stamp names, so no write was torn. A writable open keeps everything (a rebuild would
    cut the record and the deletes after it, which brings deleted keys back); the
    damaged key's get fails, and verify names it."""
    path = tmp_path / "s"
    with kvstore.open(path) as db:
        for i in range(100):
            db[k(i)] = b"x" * 50
        for i in range(4):
            del db[k(i)]
        _, keys, offsets = db.versions()
    last = bytes(keys[int(offsets.argmax())])  # the last put: its value is in VAL's tail
    val = next(path.glob("*.val"))
    data = bytearray(val.read_bytes())
    data[int(offsets.max()) + 40] ^= 1
    val.write_bytes(bytes(data))
    sizes = {p.name: p.stat().st_size for p in path.iterdir()}
    with caplog.at_level(logging.WARNING, logger="kvstore._indexfile"):
        with kvstore.open(path) as db:
            assert db.index_source == "saved" and db.recovery is None
            assert all(k(i) not in db for i in range(4))  # the deletes still stand
            assert len(db) == 96
            assert {db[k(i)] for i in range(4, 100) if k(i) != last} == {b"x" * 50}
            with pytest.raises(kvstore.exceptions.CorruptStoreError):
                db[last]
            assert [d.key for d in db.verify()] == [last]
    assert "changed in place" in caplog.text and "verify" in caplog.text
    assert {p.name: p.stat().st_size for p in path.iterdir()} == sizes  # nothing cut or saved


def test_a_format_2_value_rewritten_in_place_is_caught_by_a_rebuild(tmp_path: Path) -> None:
    """Format 2 VAL records do not name their keys, so a get could not tell another
    store's record of the same length from its own: any changed tail means a rebuild."""
    path = tmp_path / "s"
    write_plain_store(path, [(k(i), b"x" * 50) for i in range(100)])
    with kvstore.open(path):
        pass  # a clean close saves the index
    assert list(path.glob("data-*.idx"))
    val = next(path.glob("*.val"))
    data = bytearray(val.read_bytes())
    data[-10] ^= 1
    val.write_bytes(bytes(data))
    with kvstore.open(path, readonly=True) as db:
        assert db.index_source == "rebuilt"  # and the rebuild's tail check sees the damage
        assert db.recovery is not None


def test_compaction_leaves_no_stale_index_behind(tmp_path: Path) -> None:
    path = tmp_path / "s"
    model = build(path)
    with kvstore.open(path) as db:
        db.compact()
    names = sorted(p.name for p in path.glob("data-*"))
    assert [n.rsplit(".", 1)[1] for n in names] == ["idx", "key", "val"]
    assert len({n.rsplit(".", 1)[0] for n in names}) == 1  # all of one generation
    with kvstore.open(path) as db:
        assert db.index_source == "saved"
        assert_content(db, model)


def test_a_read_only_open_beside_a_live_writer_does_not_trust_the_old_save(tmp_path: Path) -> None:
    path = tmp_path / "s"
    model = build(path)
    with kvstore.open(path) as writer:
        writer[k(-1)] = model[k(-1)] = b"new"
        writer.flush()
        with kvstore.open(path, readonly=True) as reader:
            assert reader.index_source == "rebuilt"
            assert_content(reader, model)


def test_leftover_index_files_of_other_generations_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    build(path)
    (path / "data-000000.idx").write_bytes(b"old")
    (path / "data-999999.idx.tmp").write_bytes(b"torn")
    with kvstore.open(path):
        pass
    assert [p.suffix for p in path.glob("data-*.idx*")] == [".idx"]


def test_a_failed_save_costs_only_a_rebuild(tmp_path: Path) -> None:
    """Saving is best effort: an index that cannot be written (here: its name is taken
    by a directory) leaves a store that opens with everything."""
    path = tmp_path / "s"
    model = build(path)
    idx = idx_file(path)
    os.remove(idx)
    os.mkdir(idx)
    with kvstore.open(path) as db:
        assert db.index_source == "rebuilt"
    assert idx.is_dir()
    with kvstore.open(path, readonly=True) as db:
        assert_content(db, model)


def test_verify_trusts_the_saved_index_exactly_when_open_does(tmp_path: Path) -> None:
    """Whether a writable open would cut the rotted last record is the open's answer:
    no with the saved index sound, yes once a byte of its slots has rotted too."""
    path = tmp_path / "s"
    with kvstore.open(path) as db:
        for i in range(100):
            db[k(i)] = b"x" * 50
    val = next(path.glob("*.val"))
    data = bytearray(val.read_bytes())
    data[-10] ^= 1
    val.write_bytes(bytes(data))
    with kvstore.open(path, readonly=True) as db:
        assert db.index_source == "saved"
        report = db.verify_report()
        assert report.torn_tail is None and [d.key for d in report.damages] == [k(99)]
    idx = idx_file(path)
    raw = bytearray(idx.read_bytes())
    raw[len(raw) // 2] ^= 1  # a slot: the file's CRC fails
    idx.write_bytes(bytes(raw))
    with kvstore.open(path, readonly=True) as db:
        assert db.index_source == "rebuilt"
        report = db.verify_report()
        assert report.torn_tail is not None and report.torn_tail.key_records == 1
