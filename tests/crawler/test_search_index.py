"""The search index's promises beyond one clean run: kill -9 during ``index`` (while it
writes, and while it reads: what was read is not read again) then again equals a clean
build; a run stopped after reading or after merging anchor text goes on from there; a
sharded crawl searches like a one-process crawl of the same web; one run at a time; a
compacted MainDB rebuilds; the versions journal and its torn tail; kvstore's
``versions()`` that incremental indexing stands on."""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import lxml.html
import numpy as np
import pytest
import tantivy
from crawl_helpers import REPO, cli_args, run_cli, run_crawl, start_cli
from hypothesis import given, settings
from hypothesis import strategies as st

import kvstore
from crawler.exceptions import DataDirError, URLError
from crawler.read.listing import CrawlReader
from crawler.read.pagetext import DEFAULT_TEXT_LIMIT, PageText
from crawler.search import indexer, schema
from crawler.search.indexer import (
    MAX_ANCHOR_BYTES,
    SEPARATOR,
    IndexStats,
    ShardIndex,
    index_crawl,
    merge_anchors,
    read_phase,
    write_shard,
)
from crawler.search.query import Searcher
from crawler.search.spill import (
    SPILL_DIR,
    SPILLED_DIR,
    Spill,
    documents_name,
    encode_document,
    read_documents,
    write_documents,
)
from crawler.search.versions import DTYPE, JOURNAL, Versions, key_order
from crawler.state.pages import decode_page, encode_page
from crawler.web.urls import normalize, url_key
from tools.testweb import SiteConfig, TestWeb

WORDS = ("lunaka", "fiusxipu", "zereze", "orlu", "koxive", "govehace")  # the test web's


@pytest.fixture(scope="module")
def web() -> TestWeb:
    web = TestWeb(SiteConfig(pages=400, hosts=4, seed=8, crawl_delay=0.0)).start()
    yield web
    web.stop()


@pytest.fixture(scope="module")
def crawled(web: TestWeb, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("index") / "crawl"
    assert run_crawl(web, data).complete
    return data


def documents(data: Path) -> dict[str, tuple[object, ...]]:
    """Every document of a crawl's (one-shard) index, by key, its stored fields."""
    index = schema.open_index(schema.search_dir(str(data)), create=False)
    assert index is not None
    searcher = index.searcher()
    hits = searcher.search(tantivy.Query.all_query(), limit=100_000).hits
    out = {}
    for _, address in hits:
        d = searcher.doc(address).to_dict()
        out[d["key"][0]] = tuple(d.get(f, [None])[0] for f in (
            "url", "title", "description", "body", "lang", "simhash", "fetched"))
    assert len(out) == len(hits), "one document a key"
    return out


def anchors(data: Path) -> dict[bytes, bytes]:
    with kvstore.open(os.path.join(schema.search_dir(str(data)), schema.ANCHORS_DIR),
                      readonly=True) as store:
        return dict(store.items())


def results(data: Path) -> dict[str, set[str]]:
    with Searcher(str(data)) as s:
        return {w: {h.url for h in s.search(w, limit=1000).hits} | {
            u for h in s.search(w, limit=1000).hits for u in h.duplicates} for w in WORDS}


def expected_anchors(data: Path) -> dict[bytes, set[str]]:
    """target key -> the distinct texts of the followed links to it, read independently
    (lxml's tree and xpath, urljoin, the crawler's normalize)."""
    out: dict[bytes, set[str]] = defaultdict(set)
    with CrawlReader(str(data)) as reader:
        for page in reader.pages():
            if page.status != 200 or not page.body or b"<html" not in page.body[:2000].lower():
                continue
            tree = lxml.html.fromstring(page.body)
            for a in tree.xpath("//a[@href]"):
                if "nofollow" in (a.get("rel") or "").lower().split():
                    continue
                text = " ".join(a.text_content().split())
                try:
                    key = url_key(normalize(urljoin(page.url, a.get("href").strip())))
                except (URLError, ValueError):
                    continue
                if text and key != url_key(page.url):
                    out[key].add(text[:200])
    return out


def test_every_page_gets_the_texts_of_the_links_to_it(crawled: Path, tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    index_crawl(str(data))
    want = expected_anchors(data)
    got = {k: v.decode() for k, v in anchors(data).items()}
    assert set(got) == set(want) and len(got) > 100
    for key, text in got.items():
        texts = text.split(SEPARATOR)
        assert len(texts) == len(set(texts)) and texts == sorted(texts)
        assert len(text.encode()) <= MAX_ANCHOR_BYTES
        if sum(len(t.encode()) + len(SEPARATOR) for t in want[key]) <= MAX_ANCHOR_BYTES:
            assert set(texts) == want[key], key.hex()
        else:
            assert set(texts) < want[key]  # cut, never invented


def kill_once_written(proc: subprocess.Popen[bytes], journal: Path, size: int) -> None:
    """kill -9 ``proc`` as soon as ``journal`` holds ``size`` bytes."""
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.stat().st_size >= size):
        assert proc.poll() is None, "the index run ended before the kill"
        assert time.monotonic() < deadline, f"{journal}: not {size} bytes in 120 s"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()  # (closes its pipes)


def test_kill_during_index_then_index_again_equals_a_clean_build(
        crawled: Path, tmp_path: Path) -> None:
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    shutil.copytree(crawled, killed, ignore=shutil.ignore_patterns("search"))
    shutil.copytree(crawled, clean, ignore=shutil.ignore_patterns("search"))
    journal = Path(schema.search_dir(str(killed))) / JOURNAL
    proc = start_cli(["python", "-m", "crawler", "index", str(killed), "--batch", "10",
                      "--quiet"])
    # two commits journaled: the kill lands in the writing phase, mid-build
    kill_once_written(proc, journal, 2 * 10 * DTYPE.itemsize)
    partial = documents(killed)
    assert 0 < len(partial), "the commits before the kill are kept"
    again = run_cli(["python", "-m", "crawler", "index", str(killed), "--quiet", "--json"])
    assert again.returncode == 0, again.stderr
    index_crawl(str(clean))
    want = documents(clean)
    assert len(want) > 300 and len(partial) < len(want)
    assert documents(killed) == want
    assert anchors(killed) == anchors(clean)
    assert results(killed) == results(clean)


def spill_dir(data: Path) -> Path:
    return Path(schema.search_dir(str(data))) / SPILL_DIR


def test_kill_while_reading_keeps_what_was_read(crawled: Path, tmp_path: Path) -> None:
    """A kill -9 in the reading phase: the next run reads only what the killed one had
    not finished reading, and ends equal to a clean build."""
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    shutil.copytree(crawled, killed, ignore=shutil.ignore_patterns("search"))
    shutil.copytree(crawled, clean, ignore=shutil.ignore_patterns("search"))
    with kvstore.open(killed / "main", readonly=True) as main:
        records = len(main)
    journal = spill_dir(killed) / SPILLED_DIR / JOURNAL
    proc = start_cli([sys.executable, "-c", "import sys; from crawler.search.indexer import "
                      "index_crawl; index_crawl(sys.argv[1], workers=1, chunk=10)",
                      str(killed)])
    kill_once_written(proc, journal, 3 * 10 * DTYPE.itemsize)  # three tasks read
    spill = Spill(schema.search_dir(str(killed)), 0)
    read_before = len(spill)
    spill.close()
    assert 30 <= read_before < records
    again = run_cli(["python", "-m", "crawler", "index", str(killed), "--quiet", "--json"])
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["read"] == records - read_before  # each record once
    index_crawl(str(clean))
    assert documents(killed) == documents(clean)
    assert anchors(killed) == anchors(clean)
    assert results(killed) == results(clean)
    assert sorted(p.name for p in spill_dir(killed).iterdir()) == [SPILLED_DIR]


def test_a_full_disk_while_reading_keeps_the_tasks_read_and_no_half_file(
        crawled: Path, tmp_path: Path) -> None:
    """A file size limit plays the full disk: the task whose documents cannot be written
    fails the run; the tasks read before it stay in the spill, whole, and the next run
    reads only the rest and ends equal to a clean build."""
    limit = 256 << 10
    data, clean = tmp_path / "data", tmp_path / "clean"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    url = html_pages(data)[0]  # rewritten, so its record is the last read (file order)
    rng = random.Random(7)  # words that do not compress: the task's file passes the limit
    words = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=7))
                     for _ in range(150_000))
    rewrite_body(data, url, b"</p>", b"</p><p>" + words.encode() + b"</p>")
    shutil.copytree(data, clean, ignore=shutil.ignore_patterns("search"))
    with kvstore.open(data / "main", readonly=True) as main:
        records = len(main)

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = start_cli([sys.executable, "-c", "import sys; from crawler.search.indexer import "
                      "index_crawl; index_crawl(sys.argv[1], workers=1, chunk=20, "
                      "text_limit=10**7)", str(data)], preexec_fn=small_files)
    _, stderr = (b.decode() for b in proc.communicate(timeout=120))
    assert proc.returncode == 1 and "File too large" in stderr, stderr[-3000:]
    spill = Spill(schema.search_dir(str(data)), 0)  # (its open removes the .tmp)
    read_before = len(spill)
    for path in spill.documents():  # every file under its name is whole
        assert list(read_documents(path))
    spill.close()
    assert 0 < read_before < records
    assert not list(spill_dir(data).glob("*.tmp"))
    stats = index_crawl(str(data), text_limit=10**7)
    assert stats.read == records - read_before
    index_crawl(str(clean), text_limit=10**7)
    assert documents(data) == documents(clean) and anchors(data) == anchors(clean)


def test_a_documents_file_gives_back_every_field_it_was_given(tmp_path: Path) -> None:
    text = PageText(title="Widgets", description="about", headings="Spin", names="a.b c-d",
                    text="def spin(): pass", lang="en", canonical="http://x.test/c",
                    simhash=2**64 - 1, code=0.87)
    path = str(tmp_path / documents_name(0, 1))
    write_documents(path, [encode_document(b"k" * 16, 7, "http://x.test/", 1.5, text),
                           encode_document(b"g" * 16, 8, None, 0.0, None)])
    page, gone = list(read_documents(path))
    assert (page.key, page.version, page.url, page.fetched) == (b"k" * 16, 7,
                                                                "http://x.test/", 1.5)
    assert page.text == text
    assert (gone.key, gone.version, gone.url, gone.text) == (b"g" * 16, 8, None, None)


def test_a_reopened_spill_numbers_after_every_file_it_holds(tmp_path: Path) -> None:
    """Lines another node's shard sent (index --ray) and not yet merged are numbered like
    the spill's own files: a later run's never take their names (os.replace would drop
    them). The pages to index again come back once each, in key order."""
    spill = Spill(str(tmp_path), 0)
    spill.add_lines(spill.take_numbers(1), 1, b"first")
    spill.add_reanchor([b"b" * 16, b"a" * 16, b"b" * 16])
    spill.close()
    again = Spill(str(tmp_path), 0)
    again.add_lines(again.take_numbers(1), 1, b"second")
    assert sorted(Path(p).read_bytes() for p in again.lines()) == [b"first", b"second"]
    assert again.reanchor() == [b"a" * 16, b"b" * 16]
    again.close()


def rewrite_body(data: Path, url: str, old: bytes, new: bytes) -> None:
    with kvstore.open(data / "main") as main:
        page = decode_page(main[url_key(url)])
        assert old in page.body, url
        main[url_key(url)] = encode_page(replace(page, body=page.body.replace(old, new, 1)))


def html_pages(data: Path) -> list[str]:
    with CrawlReader(str(data)) as reader:
        return sorted(p.url for p in reader.pages() if p.status == 200 and p.body
                      and b"<title>" in p.body and b"</p>" in p.body)


def stopped_after(data: Path, phase: int) -> None:
    """An index run of ``data`` (one shard) that stops as a kill would after ``phase``
    (1: read, 2: anchors merged: nothing written to the index; 3: every document
    written and journaled, the spill not yet emptied)."""
    with CrawlReader(str(data)) as reader:
        s = ShardIndex(0, reader.dirs[0], reader.stores[0], rebuild=False)
        try:
            read_phase([s], 1, IndexStats(), DEFAULT_TEXT_LIMIT, 1, 25, None, 0)
            if phase >= 2:
                merge_anchors(s)
            if phase >= 3:
                s.spill.clear = lambda: None  # type: ignore[method-assign]
                write_shard(reader, s, IndexStats(), 50, 64 << 20, DEFAULT_TEXT_LIMIT)
        finally:
            s.close()


def test_a_run_stopped_after_reading_goes_on_without_reading_again(
        crawled: Path, tmp_path: Path) -> None:
    data, clean = tmp_path / "data", tmp_path / "clean"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    stopped_after(data, 1)
    assert list(spill_dir(data).glob("documents-*")) and list(spill_dir(data).glob("lines-*"))
    # a page changes after the stopped run read it
    url = html_pages(data)[0]
    rewrite_body(data, url, b"<title>", b"<title>zwoxenquil ")
    shutil.copytree(data, clean, ignore=shutil.ignore_patterns("search"))
    stats = index_crawl(str(data))
    assert stats.read == 1  # the changed record alone
    index_crawl(str(clean))
    assert documents(data) == documents(clean) and anchors(data) == anchors(clean)
    assert results(data) == results(clean)
    with Searcher(str(data)) as s:
        assert [h.url for h in s.search("zwoxenquil").hits] == [url]
    assert index_crawl(str(data)).read == 0


def test_a_run_stopped_after_merging_anchors_still_indexes_their_targets_again(
        crawled: Path, tmp_path: Path) -> None:
    """Phase 2 removes the lines it merged: the pages whose anchor text changed are
    remembered in the spill, and the next run indexes them with it."""
    data, clean = tmp_path / "data", tmp_path / "clean"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    index_crawl(str(data))
    source, target = html_pages(data)[:2]
    link = f'<p><a href="{target}">glimbrosk vantaquil</a></p>'.encode()
    rewrite_body(data, source, b"</p>", b"</p>" + link)
    stopped_after(data, 2)
    assert not list(spill_dir(data).glob("lines-*"))
    spill = Spill(schema.search_dir(str(data)), 0)
    assert spill.reanchor() == [url_key(target)]
    spill.close()
    stats = index_crawl(str(data))
    assert stats.read == 0 and stats.reanchored == 1
    shutil.copytree(data, clean, ignore=shutil.ignore_patterns("search"))
    index_crawl(str(clean))
    for d in (data, clean):
        with Searcher(str(d)) as s:
            assert [h.url for h in s.search("anchors:glimbrosk").hits] == [target]
    assert documents(data) == documents(clean) and anchors(data) == anchors(clean)


def test_a_damaged_record_is_skipped_and_the_rest_indexed(crawled: Path,
                                                          tmp_path: Path) -> None:
    """The reading workers read MainDB by version, without its index: a record that
    fails its CRC is skipped and counted, in a worker process or not, and the others are
    indexed as in an undamaged crawl."""
    clean = tmp_path / "clean"
    shutil.copytree(crawled, clean, ignore=shutil.ignore_patterns("search"))
    index_crawl(str(clean))
    url = html_pages(clean)[0]
    with kvstore.open(clean / "main", readonly=True) as main:
        gen, version = main.versions_of([url_key(url)])
    for workers in (1, 2):
        data = tmp_path / f"damaged-{workers}"
        shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
        with open(data / "main" / f"data-{gen:06d}.val", "r+b") as f:
            f.seek(int(version[0]) + 24 + 40)  # 24: a keyed record's header (FORMAT.md)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        stats = index_crawl(str(data), workers=workers, chunk=37)
        assert stats.skipped == 1, workers
        want = documents(clean)
        del want[url_key(url).hex()]
        assert documents(data) == want


def test_new_anchor_text_reaches_a_page_written_by_a_run_killed_before_its_end(
        crawled: Path, tmp_path: Path) -> None:
    """A run killed after writing every document, before it emptied its spill: the
    spill still lists every record as read, but their documents are in the index, so a
    page that gets new anchor text later is indexed again with it."""
    data = tmp_path / "data"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    stopped_after(data, 3)
    assert not list(spill_dir(data).glob("documents-*"))
    source, target = html_pages(data)[:2]
    link = f'<p><a href="{target}">glimbrosk vantaquil</a></p>'.encode()
    rewrite_body(data, source, b"</p>", b"</p>" + link)
    stats = index_crawl(str(data))
    assert stats.read == 1 and stats.reanchored == 1
    with Searcher(str(data)) as s:
        assert [h.url for h in s.search("anchors:glimbrosk").hits] == [target]


def test_worker_processes_build_the_same_index(crawled: Path, tmp_path: Path) -> None:
    pooled, alone = tmp_path / "pooled", tmp_path / "alone"
    for d in (pooled, alone):
        shutil.copytree(crawled, d, ignore=shutil.ignore_patterns("search"))
    a = index_crawl(str(pooled), workers=2, chunk=37)  # ~12 tasks over two processes
    b = index_crawl(str(alone), workers=1)
    assert (a.read, a.indexed, a.documents) == (b.read, b.indexed, b.documents)
    assert documents(pooled) == documents(alone) and anchors(pooled) == anchors(alone)


def test_a_second_run_at_once_is_refused(crawled: Path, tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    with kvstore.open(data / "main", readonly=True) as main:
        first = ShardIndex(0, str(data), main, rebuild=False)
        try:
            with pytest.raises(DataDirError, match="another index run"):
                index_crawl(str(data))
        finally:
            first.close()
    assert index_crawl(str(data)).indexed > 300  # the lock is gone with its holder


def test_a_damaged_index_is_one_line_and_rebuild_repairs_it(crawled: Path,
                                                            tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    want = index_crawl(str(data)).documents
    tantivy_dir = Path(schema.search_dir(str(data))) / "tantivy"
    segment = max(tantivy_dir.glob("*.idx"), key=lambda p: p.stat().st_size)
    with open(segment, "r+b") as f:
        f.truncate(100)
    for argv in (["search", str(data), "lunaka"], ["index", str(data)]):
        done = run_cli(["python", "-m", "crawler", *argv])
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "the search index is damaged" in lines[0], lines
        assert "index DIR --rebuild" in lines[0]
    report = run_cli(["python", "-m", "crawler", "report", str(data), "--format", "json",
                      "--quiet"])  # the report goes on without its site section
    assert report.returncode == 0, report.stderr
    assert "site" not in json.loads(report.stdout)
    assert "the report's site section is left out" in report.stderr
    again = run_cli(["python", "-m", "crawler", "index", str(data), "--rebuild", "--quiet"])
    assert again.returncode == 0, again.stderr
    assert len(documents(data)) == want and results(data)["lunaka"]
    # the index files alone removed: the versions describe nothing, so it starts again
    shutil.rmtree(tantivy_dir)
    assert index_crawl(str(data)).documents == want


def test_a_compacted_maindb_is_indexed_again_from_nothing(crawled: Path,
                                                          tmp_path: Path) -> None:
    data = tmp_path / "c"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    first = index_crawl(str(data))
    with kvstore.open(data / "main") as main:
        main.compact()
    again = index_crawl(str(data))
    assert again.rebuilt == 1 and again.indexed == first.indexed
    assert index_crawl(str(data)).read == 0


def test_a_compaction_between_the_snapshot_and_the_reading_is_one_line(
        crawled: Path, tmp_path: Path) -> None:
    """The readers open the snapshot's generation; compacted away before they could
    (a crawl beside the run), the run stops with a line saying to run it again."""
    data = tmp_path / "c"
    shutil.copytree(crawled, data, ignore=shutil.ignore_patterns("search"))
    with CrawlReader(str(data)) as reader:
        s = ShardIndex(0, reader.dirs[0], reader.stores[0], rebuild=False)
        try:
            with kvstore.open(data / "main") as main:
                main.compact()
            with pytest.raises(DataDirError, match="compacted since this index run began; "
                               "run index again"):
                read_phase([s], 1, IndexStats(), DEFAULT_TEXT_LIMIT, 1, 25, None, 0)
        finally:
            s.close()
    again = index_crawl(str(data))
    assert again.rebuilt == 1 and again.documents > 300


def test_a_sharded_crawl_finds_what_a_one_process_crawl_finds(
        web: TestWeb, crawled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "sharded"
    done = subprocess.run(cli_args(web, data, "--processes", "2"), cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    one = tmp_path / "one"
    shutil.copytree(crawled, one, ignore=shutil.ignore_patterns("search"))
    assert index_crawl(str(one)).shards == 1
    # one shard's anchor store open at a time (its key index is ~0.8 GB at 20M), none
    # while reading: which are open as each phase of each shard ends
    opened: list[ShardIndex] = []
    real_init = ShardIndex.__init__

    def init(self: ShardIndex, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(ShardIndex, "__init__", init)
    held: list[tuple[str, list[int]]] = []
    def spy(name: str) -> Any:
        real = getattr(indexer, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            held.append((name, [s.shard for s in opened if s._anchors is not None]))
            return out
        return call

    for name in ("read_phase", "merge_anchors", "write_shard"):
        monkeypatch.setattr(indexer, name, spy(name))
    stats = index_crawl(str(data))
    assert held == [("read_phase", []), ("merge_anchors", [0]), ("merge_anchors", [1]),
                    ("write_shard", [0]), ("write_shard", [1])]
    assert stats.shards == 2 and stats.documents == len(documents(one))
    for i in range(2):  # each shard indexes its own pages
        assert os.path.isdir(os.path.join(data, f"shard-{i:02d}", schema.SEARCH_DIR))
    sharded = results(data)
    assert sharded == results(one) and all(sharded.values())
    # anchor text crosses shards: a page is found by the words of links on other hosts
    with Searcher(str(data)) as s, Searcher(str(one)) as o:
        for word in WORDS:
            assert ({h.url for h in s.search(f"anchors:{word}", limit=1000).hits}
                    == {h.url for h in o.search(f"anchors:{word}", limit=1000).hits})


def test_versions_journal_replays_ignores_a_torn_tail_and_checkpoints(tmp_path: Path) -> None:
    keys = [bytes([i]) * 16 for i in range(5)]
    v = Versions(str(tmp_path))
    v.record([(keys[0], 10, 1), (keys[1], 20, 2)])
    v.record([(keys[0], 30, 3)])
    v.close()
    with open(tmp_path / JOURNAL, "ab") as f:
        f.write(b"\x01" * 20)  # a record cut by a kill
    v = Versions(str(tmp_path))
    # folded at the open: mapped from the file, not held (0.7 GB at 21M records)
    assert (tmp_path / JOURNAL).stat().st_size == 0 and isinstance(v.table, np.memmap)
    kv = np.frombuffer(b"".join(keys[:3]), dtype="V16")
    assert v.lookup(kv)[0].tolist() == [30, 20, -2]
    assert v.lookup(kv)[1].tolist() == [3, 2, -2]
    snapshot = np.frombuffer(b"".join([keys[0], keys[2]]), dtype="V16")
    assert v.changed(snapshot, np.array([30, 5])).tolist() == [False, True]
    assert [bytes(k) for k in v.gone(snapshot).tolist()] == [keys[1]]
    v.record([(keys[1], -1, 0)])  # gone: forgotten at the checkpoint
    v.checkpoint()
    assert (tmp_path / JOURNAL).stat().st_size == 0 and len(v) == 1
    v.close()
    v = Versions(str(tmp_path))
    assert v.lookup(kv)[0].tolist() == [30, -2, -2]
    v.close()


@settings(max_examples=100, deadline=None)
@given(highs=st.lists(st.sampled_from([0, 1, 2**63, 2**64 - 1]), min_size=0, max_size=40),
       data=st.data())
def test_keys_sorted_and_found_by_their_halves_as_whole_keys(highs: list[int],
                                                              data: st.DataObject) -> None:
    """The versions table sorts and searches 16-byte keys by their first 8 bytes: forced
    to share them here (md5 keys almost never do), the order, the lookups and the keys
    gone must still be those of the whole keys."""
    lows = data.draw(st.lists(st.integers(0, 3), min_size=len(highs), max_size=len(highs)))
    raw = [h.to_bytes(8, "big") + lo.to_bytes(8, "big") for h, lo in zip(highs, lows,
                                                                          strict=True)]
    keys = np.frombuffer(b"".join(raw), dtype="V16") if raw else np.zeros(0, dtype="V16")
    assert key_order(keys).tolist() == sorted(range(len(raw)), key=lambda i: raw[i])
    want = {key: n for n, key in enumerate(raw)}  # the last version of each key wins
    queries = [h.to_bytes(8, "big") + lo.to_bytes(8, "big")
               for h in (0, 1, 5, 2**63, 2**64 - 1) for lo in range(5)]
    with tempfile.TemporaryDirectory() as d:
        v = Versions(d)
        v.record([(key, n, 0) for n, key in enumerate(raw)])
        v.checkpoint()
        vers = v.lookup(np.frombuffer(b"".join(queries), dtype="V16"))[0].tolist()
        assert vers == [want.get(q, -2) for q in queries]
        snapshot = queries[::2]
        gone = v.gone(np.frombuffer(b"".join(snapshot), dtype="V16"))
        assert sorted(bytes(k) for k in gone.tolist()) == sorted(set(raw) - set(snapshot))
        v.close()


def test_kvstore_versions_change_with_a_write_and_a_compaction(tmp_path: Path) -> None:
    with kvstore.open(tmp_path / "db") as db:
        db[b"a" * 16] = b"one"
        db[b"b" * 16] = b"two"
        gen, keys, vers = db.versions()
        before = dict(zip([bytes(k) for k in keys], vers.tolist(), strict=True))
        db[b"a" * 16] = b"one again"
        gen2, keys, vers = db.versions()
        after = dict(zip([bytes(k) for k in keys], vers.tolist(), strict=True))
        assert gen2 == gen and after[b"b" * 16] == before[b"b" * 16]
        assert after[b"a" * 16] != before[b"a" * 16]
        del db[b"b" * 16]
        assert db.versions()[1].tolist() == [list(b"a" * 16)]
        db.compact()
        assert db.versions()[0] == gen + 1
    with kvstore.open(tmp_path / "db", readonly=True) as ro:
        g, keys, vers = ro.versions()
        assert (g, [bytes(k) for k in keys]) == (gen + 1, [b"a" * 16])
