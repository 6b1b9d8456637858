"""Outputs that are whole or absent even when Ctrl-C lands between two statements: the
ledger (crawler.read._outfile.Outputs) knows a file from before it exists, so an export
or a report given up at any point leaves nothing, and never removes a file it did not
make. The interrupts are injected at the two seams where a caller cannot yet know its
file: just after the ``.part`` is created, just after the rename."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

import kvstore
from crawler.cli import main
from crawler.read import _outfile
from crawler.read.export import export
from crawler.state.pages import PageRecord, encode_page
from crawler.web.urls import url_key


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A crawl of 24 pages of 64 KiB each, incompressible: a 256K split makes 6 files."""
    root = tmp_path / "crawl"
    root.mkdir()
    with kvstore.open(root / "main") as db:
        for i in range(24):
            url = f"http://a.test/{i}.html"
            db[url_key(url)] = encode_page(PageRecord(
                url, 200, 1.7e9 + i, 0, content_type="text/html",
                body=random.Random(i).randbytes(64 << 10)))
    return root


@pytest.fixture
def out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def interrupt_after(nth: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that its ``nth`` call (1-based) does its work, then raises
    KeyboardInterrupt as a Ctrl-C would before the caller sees the result."""
    calls = 0

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        result = real(*args, **kwargs)
        if calls == nth:
            if hasattr(result, "close"):  # the handle is lost; closed here, not left to gc
                result.close()
            raise KeyboardInterrupt
        return result
    return wrapped


@pytest.mark.parametrize("nth", [1, 3])
def test_ctrl_c_as_a_part_file_is_created_leaves_nothing(
    data: Path, out: Path, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # nth 3: two files finished, the third's .part just made and its handle never kept
    monkeypatch.setattr(_outfile, "create", interrupt_after(nth, _outfile.create))
    with pytest.raises(KeyboardInterrupt):
        export(data, warc=out / "c.warc.gz", jsonl=out / "c.jsonl", max_size=256 << 10)
    assert sorted(out.iterdir()) == []


@pytest.mark.parametrize("nth", [1, 2])
def test_ctrl_c_just_after_a_rename_leaves_nothing(
    data: Path, out: Path, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # the file is whole under its final name, but the sink never noted it
    monkeypatch.setattr(_outfile.os, "replace", interrupt_after(nth, os.replace))
    with pytest.raises(KeyboardInterrupt):
        export(data, warc=out / "r.warc.gz", wacz=out / "r.wacz", max_size=256 << 10)
    assert sorted(out.iterdir()) == []


def test_ctrl_c_as_the_report_file_is_created_leaves_nothing(
    data: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_outfile, "create", interrupt_after(1, _outfile.create))
    assert main(["report", str(data), "--format", "json", "--out", str(out / "r.json"),
                 "--quiet"]) == 130
    assert sorted(out.iterdir()) == []
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "crawler: report interrupted: nothing written")


def test_discard_removes_only_the_files_it_made(out: Path) -> None:
    outputs = _outfile.Outputs()
    mine = outputs.create(str(out / "a"), "w")
    mine.write("a")
    outputs.publish(mine, str(out / "a"))
    part = outputs.create(str(out / "b"), "w")
    # someone else's file replaces a finished one, and one stands where b would go
    (out / "a.new").write_text("theirs")
    os.replace(out / "a.new", out / "a")
    (out / "b").write_text("theirs too")
    outputs.discard(part)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a": "theirs",
                                                             "b": "theirs too"}


def test_discard_removes_a_finished_file_and_a_part(out: Path) -> None:
    outputs = _outfile.Outputs()
    for name in ("a", "b"):
        f: IO[Any] = outputs.create(str(out / name), "w")
        f.write(name)
        if name == "a":
            outputs.publish(f, str(out / name))
    assert sorted(p.name for p in out.iterdir()) == ["a", "b.part"]
    assert outputs.finished == [str(out / "a")]
    outputs.discard(f)
    outputs.discard()  # idempotent
    assert sorted(out.iterdir()) == []


def test_a_planted_part_is_refused_and_left_alone(out: Path) -> None:
    target = out / "precious"
    target.write_text("keep")
    (out / "x.part").symlink_to(target)
    outputs = _outfile.Outputs()
    with pytest.raises(FileExistsError, match="never written through"):
        outputs.create(str(out / "x"), "w")
    outputs.discard()  # nothing was made: the link is not ours to remove
    assert target.read_text() == "keep"
    assert (out / "x.part").is_symlink()
