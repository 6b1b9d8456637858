"""Compaction stopped between its steps: the files a crash leaves, laid out for real.

FORMAT.md: compaction writes ``data-<gen+1>.val.tmp`` and ``.key.tmp``, renames
the VAL one, then the KEY one, then deletes generation ``<gen>``. Until the
second rename ``<gen>`` is the store; after it ``<gen+1>`` holds everything.
Each state is built from a real compaction's output (only the documented file
names are used), so the tests are deterministic, unlike the kill -9 loop of
test_crash.py, which lands in these windows only by chance.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import kvstore


def k(i: int) -> bytes:
    return kvstore.md5_key(f"c{i}")


def build_model(path: Path) -> dict[bytes, bytes]:
    """A store with overwrites and deletes, so compaction changes every offset."""
    model: dict[bytes, bytes] = {}
    with kvstore.open(path) as db:
        for i in range(300):
            db[k(i)] = b"first %d " % i * (i % 7)
        for i in range(0, 300, 3):
            db[k(i)] = b"second %d" % i
        for i in range(0, 300, 5):
            del db[k(i)]
        model = {key: db[key] for key in db}
    return model


def generation_files(path: Path) -> dict[str, bytes]:
    """Every data-* file (any generation, any suffix) and its bytes."""
    return {p.name: p.read_bytes() for p in path.iterdir() if p.name.startswith("data-")}


def one_pair(path: Path) -> tuple[str, str]:
    keys = sorted(p.name for p in path.glob("data-*.key"))
    vals = sorted(p.name for p in path.glob("data-*.val"))
    assert len(keys) == 1 and len(vals) == 1, sorted(generation_files(path))
    return keys[0], vals[0]


# Each state: which of the new generation's files exist, and under which name.
STATES = {
    "tmp-files-written": {".val": ".val.tmp", ".key": ".key.tmp"},
    "between-the-renames": {".val": ".val", ".key": ".key.tmp"},
    "after-the-renames": {".val": ".val", ".key": ".key"},
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The store before compaction, the new generation's two files, and the model."""
    base = tmp_path_factory.mktemp("compaction")
    old = base / "old"
    model = build_model(old)
    new = base / "new"
    shutil.copytree(old, new)
    with kvstore.open(new) as db:
        db.compact()
    old_key, old_val = one_pair(old)
    new_key, new_val = one_pair(new)
    assert new_key != old_key and new_key[:-4] == new_val[:-4]
    return {
        "old": old,
        "new_stem": new_key[:-4],
        "new_files": {".key": (new / new_key).read_bytes(), ".val": (new / new_val).read_bytes()},
        "old_pair": (old_key, old_val),
        "new_pair": (new_key, new_val),
        "model": model,
    }


def lay_out(layouts: dict[str, object], state: str, dest: Path) -> None:
    shutil.copytree(layouts["old"], dest)  # type: ignore[arg-type]
    stem = layouts["new_stem"]
    for suffix, name_suffix in STATES[state].items():
        (dest / f"{stem}{name_suffix}").write_bytes(layouts["new_files"][suffix])  # type: ignore[index]


@pytest.mark.parametrize("state", list(STATES))
def test_readonly_open_sees_every_record_and_deletes_nothing(
    layouts: dict[str, object], tmp_path: Path, state: str
) -> None:
    dest = tmp_path / "store"
    lay_out(layouts, state, dest)
    before = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
    with kvstore.open(dest, readonly=True) as ro:
        assert len(ro) == len(layouts["model"])  # type: ignore[arg-type]
        assert {key: ro[key] for key in ro} == layouts["model"]
        assert ro.verify() == []
    after = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
    assert after == before, "a read-only open changed the directory"


@pytest.mark.parametrize("state", list(STATES))
def test_writer_open_sees_every_record_and_removes_the_leftovers(
    layouts: dict[str, object], tmp_path: Path, state: str
) -> None:
    dest = tmp_path / "store"
    lay_out(layouts, state, dest)
    model = dict(layouts["model"])  # type: ignore[call-overload]
    # Until the second rename the old generation is the store; after it, the new one.
    survivor = layouts["new_pair"] if state == "after-the-renames" else layouts["old_pair"]
    with kvstore.open(dest) as db:
        assert {key: db[key] for key in db} == model
        names = sorted(generation_files(dest))
        data = [n for n in names if not n.endswith(".idx")]
        assert data == sorted(survivor), "leftovers were kept"
        # A clean close saves the index (data-<gen>.idx): only the survivor's may stay.
        assert all(n[:-4] == survivor[0][:-4] for n in names if n.endswith(".idx")), names
        assert not (dest / "recovered").exists()
        db[k(1000)] = b"after the interrupted compaction"
        del db[k(1)]
        model[k(1000)] = b"after the interrupted compaction"
        del model[k(1)]
        db.compact()  # compacting again over the same generation number works
        assert {key: db[key] for key in db} == model
    assert len(set(one_pair(dest))) == 2
    with kvstore.open(dest) as db:
        assert {key: db[key] for key in db} == model
        assert db.verify() == []


def test_a_failed_second_rename_leaves_the_store_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second rename fails for real in the process (a spy on rename and replace
    refuses the ``.key.tmp`` one): compaction raises, the store keeps every record
    and keeps working, and the next opens (read-only, then writer) agree."""
    path = tmp_path / "store"
    model = build_model(path)
    refused: list[str] = []
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def refuse(src: str, dst: str, *args: object, _real=real, **kwargs: object) -> None:
            if os.fspath(src).endswith(".key.tmp"):
                refused.append(os.path.basename(os.fspath(src)))
                raise OSError(5, "injected failure of the second rename", src)
            _real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, name, refuse)
    with kvstore.open(path) as db:
        with pytest.raises(OSError, match="injected"):
            db.compact()
        monkeypatch.undo()
        assert refused, "compaction published without renaming a .key.tmp (FORMAT.md)"
        assert {key: db[key] for key in db} == model
        db[k(2000)] = b"written after the failed compaction"
        model[k(2000)] = b"written after the failed compaction"
        db.flush()
        with kvstore.open(path, readonly=True) as ro:
            assert {key: ro[key] for key in ro} == model
    with kvstore.open(path, readonly=True) as ro:
        assert {key: ro[key] for key in ro} == model
    with kvstore.open(path) as db:
        assert {key: db[key] for key in db} == model
        assert not [n for n in generation_files(path) if n.endswith(".tmp")]
        one_pair(path)
        db.compact()
        assert {key: db[key] for key in db} == model
