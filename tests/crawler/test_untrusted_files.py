"""A crawl directory is data (issue 42, item 4): a file someone put there, or one that
rotted, never runs code and is never a traceback. A planted pickle in the index spill is
refused in one line and not run; a query the query language cannot read is searched as
words (``search`` and ``serve``); numbers no file of ours holds (10**400) and a damaged
versions table are one line naming the file and the fix."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from crawl_helpers import REPO, ended, start_python
from crawldir_helpers import ordinary_pages, write_crawl

from crawler.cli import main
from crawler.search import schema
from crawler.search.spill import DOCS_MAGIC, SPILL_DIR, SPILLED_DIR, documents_name, read_documents
from crawler.search.versions import BASE, DTYPE

WAIT = 60  # seconds a command of these tests may take, at most


def one_error_line(err: str, *words: str) -> None:
    """``err`` is exactly one ``crawler: error:`` line holding each of ``words``."""
    assert err.count("\n") == 1 and err.startswith("crawler: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A crawl of ordinary pages, indexed and ranked."""
    data = write_crawl(tmp_path_factory.mktemp("untrusted") / "crawl", ordinary_pages())
    assert main(["index", str(data), "--quiet", "--workers", "1"]) == 0
    assert main(["rank", str(data), "--quiet"]) == 0
    return data


@pytest.fixture
def copy(indexed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    target = tmp_path / "crawl"
    shutil.copytree(indexed, target)
    capsys.readouterr()
    return target


# -- the index spill: our own records, never a pickle ----------------------------------------


class Planted:
    """What the audit planted: unpickling it makes a marker (os.mkdir here; it could run
    anything as the user)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (self.marker,)


def planted_pickle(marker: Path) -> bytes:
    payload = pickle.dumps(Planted(marker))
    check = marker.with_name(marker.name + ".check")
    pickle.loads(pickle.dumps(Planted(check)))  # noqa: S301 - the payload works: it ran
    assert check.exists()
    return payload


def test_a_planted_pickle_in_the_spill_is_refused_in_one_line_and_never_run(
        copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    spill = copy / "search" / SPILL_DIR
    planted = spill / documents_name(0, 0)
    planted.write_bytes(gzip.compress(planted_pickle(marker)))
    assert main(["index", str(copy), "--quiet", "--workers", "1"]) == 1
    one_error_line(capsys.readouterr().err, str(planted), "index DIR --rebuild")
    assert not marker.exists()
    with pytest.raises(Exception, match="not a documents file"):
        next(read_documents(str(planted)))
    assert not marker.exists()
    # the fix the line names works: a rebuild empties the spill and indexes every page
    assert main(["index", str(copy), "--rebuild", "--quiet", "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == len(ordinary_pages())
    assert not planted.exists() and not marker.exists()


def test_the_cli_refusal_is_one_line_in_a_subprocess_too(copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    planted = copy / "search" / SPILL_DIR / documents_name(0, 7)
    planted.write_bytes(gzip.compress(planted_pickle(marker)))
    done = subprocess.run([sys.executable, "-m", "crawler", "index", str(copy), "--quiet",
                           "--workers", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=WAIT, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 1
    one_error_line(done.stderr, str(planted), "--rebuild")
    assert not marker.exists()


# (mtime=0: gzip's header holds the time, and xdist's workers must collect the same ids)
@pytest.mark.parametrize("content", [
    b"not gzip at all", gzip.compress(b"", mtime=0)[:-3],
    gzip.compress(DOCS_MAGIC + b"\1" * 80, mtime=0)],
    ids=["not gzip", "cut gzip", "not records"])
def test_a_damaged_documents_file_is_one_line(
        content: bytes, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    planted = copy / "search" / SPILL_DIR / documents_name(0, 3)
    planted.write_bytes(content)
    assert main(["index", str(copy), "--quiet", "--workers", "1"]) == 1
    one_error_line(capsys.readouterr().err, str(planted), "--rebuild")


@pytest.mark.parametrize("content", [b"zz\tnot a key\n", b"\xff\xfe\n", b"no tab at all\n"])
def test_a_damaged_lines_file_is_one_line(
        content: bytes, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    planted = copy / "search" / SPILL_DIR / "lines-0-0-0000000009.gz"
    planted.write_bytes(gzip.compress(content))
    assert main(["index", str(copy), "--quiet", "--workers", "1"]) == 1
    one_error_line(capsys.readouterr().err, str(planted), "--rebuild")


def test_no_file_of_a_crawl_is_unpickled_or_evaluated() -> None:
    """The tree's own promise: no pickle, marshal, shelve, eval or exec in the code that
    reads a crawl directory. The shards' config crosses a pipe from the supervisor that
    started them (crawler.run.supervisor -> shard.child_main's stdin), never a file:
    that one pickle stays, and is the only one."""
    found = []
    for path in sorted((REPO / "crawler").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\b(pickle|marshal|shelve|cPickle|dill|joblib)\b|\beval\(|\bexec\(|"
                         r"allow_pickle=True|literal_eval", code):
                found.append(f"{path.relative_to(REPO)}:{n}")
    assert {f.rsplit(":", 1)[0] for f in found} <= {"crawler/run/shard.py",
                                                    "crawler/run/supervisor.py"}, found


# -- queries: what the query language cannot read is searched as words ------------------------


def search_json(data: Path, query: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["search", str(data), query, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    result: dict[str, object] = json.loads(out)
    return result


@pytest.mark.parametrize("query", ["title:*", "url:*", "host:*", "title:granite OR title:*",
                                   "fetched:*", "title:(granite", '"unclosed granite',
                                   "nosuchfield:granite", "granite^x", "AND granite"])
def test_a_query_the_language_cannot_read_is_searched_as_words(
        query: str, indexed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = search_json(indexed, query, capsys)
    words = re.findall(r"\w+", query)
    assert result["matches"] == search_json(indexed, " ".join(words), capsys)["matches"]


def test_field_star_searches_its_words(indexed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``title:*`` was 28 lines of traceback: now the word "title" (in no page here)."""
    assert search_json(indexed, "title:*", capsys)["matches"] == 0
    hits = search_json(indexed, "granite:*", capsys)["hits"]
    assert isinstance(hits, list) and hits
    assert all("granite" in str(h["title"]).lower() for h in hits)


def test_a_query_with_no_word_is_one_line(indexed: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(indexed), "(("]) == 1
    one_error_line(capsys.readouterr().err, "cannot read the query", "no word")


@pytest.fixture
def serving(indexed: Path) -> Iterator[int]:
    """``python -m crawler serve`` on the indexed crawl: its port."""
    proc = start_python(["-m", "crawler", "serve", str(indexed), "--port", "0", "--no-rank"])
    try:
        assert proc.stdout is not None
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
        assert m is not None
        port = int(m.group(1))
        # the first report computed before the test goes on: a SIGTERM while it is being
        # computed is tests/crawler/test_serve.py's case, not this test's
        deadline = time.monotonic() + WAIT
        while get_path(port, "/report.json")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        err = ended(proc, WAIT)
    assert "Traceback" not in err, err[-3000:]


def get_path(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=WAIT) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode("utf-8")


def get(port: int, query: str) -> tuple[int, str]:
    return get_path(port, "/search?" + urllib.parse.urlencode({"q": query}))


def test_serve_answers_field_star_queries(serving: int) -> None:
    status, page = get(serving, "granite:*")
    assert status == 200 and "matching pages" in page and "Granite" in page
    status, page = get(serving, "title:*")
    assert status == 200 and "No page matches." in page
    status, page = get(serving, "((")
    assert status == 400 and "no word" in page


# -- numbers no file of ours holds ----------------------------------------------------------------

HUGE = "1" + "0" * 400


def set_number(path: Path, key: str, text: str) -> None:
    doc = json.loads(path.read_text())
    doc[key] = "@@"
    path.write_text(json.dumps(doc).replace('"@@"', text))


@pytest.mark.parametrize("text", [HUGE, "-" + HUGE, "1e400", "123456789012345678901"])
@pytest.mark.parametrize("key", ["time", "fetched", "elapsed", "pages_per_s"])
def test_a_huge_number_in_status_json_is_one_line(
        key: str, text: str, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copy / "status.json").write_text('{"time": 1.7e9, "running": false, "fetched": 3}')
    set_number(copy / "status.json", key, text)
    assert main(["status", str(copy)]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "status.json"), "delete it")


RANK_FILES = {"rank.json": ["max_rank", "iterations"], "graph.json": ["records", "fetched"]}


@pytest.mark.parametrize("text", [HUGE, "1e400", "123456789012345678901"])
@pytest.mark.parametrize(("name", "key"), [(n, k) for n, ks in RANK_FILES.items() for k in ks])
@pytest.mark.parametrize("command", [["pages", "{d}", "--sort", "rank"],
                                     ["search", "{d}", "granite"]])
def test_a_huge_number_in_the_rank_store_is_one_line(
        name: str, key: str, text: str, command: list[str], copy: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    set_number(copy / "rank" / name, key, text)
    status = main([arg.format(d=copy) for arg in command])
    out, err = capsys.readouterr()
    if status == 0:  # a field the command does not read: nothing wrong for it
        assert err == "" and key == "iterations", (key, err)
        return
    assert status == 1
    one_error_line(err, str(copy / "rank"), "crawler rank")


@pytest.mark.parametrize("records", ["10000000000000000000", "9223372036854775807"])
def test_a_record_count_no_map_can_hold_is_one_line(
        records: str, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Within 64 bits, so read; past what a file can be mapped as (OverflowError)."""
    set_number(copy / "rank" / "graph.json", "records", records)
    assert main(["pages", str(copy), "--sort", "rank"]) == 1
    one_error_line(capsys.readouterr().err, str(copy / "rank"), "crawler rank")


# -- the versions table of the search index ------------------------------------------------------


def npy(table: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, table, allow_pickle=False)
    return out.getvalue()


VERSIONS_DAMAGE = {
    "empty": b"",
    "half": npy(np.zeros(100, dtype=DTYPE))[:1800],
    "garbage": b"\x80\x04garbage" * 50,
    "a pickle": pickle.dumps([1, 2, 3]),
    "objects": b"",  # (written with np.save below)
    "other dtype": npy(np.zeros(10, dtype=np.float64)),
    "two dimensions": npy(np.zeros((2, 3), dtype=DTYPE)),
}


@pytest.mark.parametrize("where", ["index", "spill"])
@pytest.mark.parametrize("damage", sorted(VERSIONS_DAMAGE))
def test_a_damaged_versions_table_is_one_line_and_rebuild_mends_it(
        damage: str, where: str, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    search = copy / "search"
    path = search / BASE if where == "index" else search / SPILL_DIR / SPILLED_DIR / BASE
    if damage == "objects":
        np.save(path, np.array([1, "a", None], dtype=object), allow_pickle=True)
    else:
        path.write_bytes(VERSIONS_DAMAGE[damage])
    assert main(["index", str(copy), "--quiet", "--workers", "1"]) == 1
    one_error_line(capsys.readouterr().err, str(path), "index DIR --rebuild")
    assert main(["index", str(copy), "--rebuild", "--quiet", "--workers", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == len(ordinary_pages())
    assert main(["search", str(copy), "granite", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches"] > 0


def test_a_damaged_index_state_is_one_line_and_rebuild_mends_it(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = copy / "search" / schema.STATE
    state.write_text('{"format": ' + HUGE + "}")
    assert main(["index", str(copy), "--quiet", "--workers", "1"]) == 1
    one_error_line(capsys.readouterr().err, str(state), "--rebuild")
    assert main(["index", str(copy), "--rebuild", "--quiet", "--workers", "1"]) == 0
