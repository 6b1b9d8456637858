"""Phase 1 of an index run (crawler.search.indexer): read the changed records and what
their pages say, in worker processes.

Reading a page (resiliparse's parse and main-content extraction, the SimHash, the
links) is CPU work that holds the GIL in part, so a run spreads it over processes: the
records to read, in file order, are cut into tasks of :data:`CHUNK`; each worker opens
the crawl read-only once and, for each task, writes two kinds of files into the run's
temporary directory: the *documents* (one pickled tuple per record, what phase 3 adds
to the index; a record that is not an indexable page is there too, so its version is
journaled) and, per shard owning the targets, the *anchor lines* of its links
(``target key hex, TAB, text``). Results come back in task order, so the documents are
written to the index in file order whatever finished first. Small runs (one task) and
``workers=1`` read in the calling process: same files, no pool.

Thread safety: a task touches only its own files.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..exceptions import URLError
from ..read.listing import CrawlReader
from ..read.pagetext import PageText, page_text
from ..state.pages import NOFOLLOW, PageRecord
from ..state.shards import owner
from ..web.urls import host_of, normalize, url_key

CHUNK = 1_000  # records a task
# (key, version, URL, fetch time, what the page says): URL and text are None for a
# record that is not an indexable page
Spilled = tuple[bytes, int, str | None, float, PageText | None]


@dataclass(slots=True)
class Part:
    """What one task made."""

    documents: str
    lines: dict[int, str] = field(default_factory=dict)  # owning shard -> its lines file
    read: int = 0
    skipped: int = 0  # damaged records


@dataclass(frozen=True, slots=True)
class Task:
    number: int
    shard: int
    keys: bytes  # the records' keys, 16 bytes each, in file order
    versions: tuple[int, ...]
    tmp: str  # the run's temporary directory
    count: int  # shards of the crawl
    live: frozenset[int]  # shards being indexed (the others' links are not routed)
    text_limit: int


def indexable(page: PageRecord, text_limit: int) -> PageText | None:
    """What the index reads from ``page``; None when it is not indexed: an error, a
    redirect, ``noindex``, no text body. (A revisit's record carries the earlier fetch's
    body: it is indexed.)"""
    if page.status != 200 or page.noindex or not page.body:
        return None
    text = page_text(page, text_limit=text_limit)
    if text is None or not (text.text or text.title):
        return None
    return text


def anchor_lines(page: PageRecord, text: PageText, count: int,
                 live: frozenset[int]) -> Iterator[tuple[int, bytes]]:
    """(owning shard, line) for each followed link with text to another page."""
    own = url_key(page.url)
    # rel=nofollow (or a page-wide nofollow): the record's link flags say (its first
    # flag, as the crawler followed it); such links vouch for nothing
    nofollow = {key for key, flags in page.link_list() if flags & NOFOLLOW}
    base = text.base or page.final_url or page.url
    for href, words in text.links:
        try:
            target = normalize(href, base)
        except URLError:
            continue  # another scheme, a bad host, too long: not a page of a crawl
        key = url_key(target)
        dest = owner(host_of(target), count) if count > 1 else 0
        if key != own and key not in nofollow and dest in live:
            yield dest, key.hex().encode("ascii") + b"\t" + words.encode("utf-8") + b"\n"


def read_task(task: Task, reader: CrawlReader) -> Part:
    part = Part(os.path.join(task.tmp, f"documents-{task.shard}-{task.number:06d}"))
    outs: dict[int, object] = {}
    skipped = reader.skipped
    try:
        with open(part.documents, "wb") as docs:
            for i, ver in enumerate(task.versions):
                key = task.keys[i * 16:(i + 1) * 16]
                page = reader.load(task.shard, key)
                part.read += 1
                text = None if page is None else indexable(page, task.text_limit)
                if page is None or text is None:
                    pickle.dump((key, ver, None, 0.0, None), docs, pickle.HIGHEST_PROTOCOL)
                    continue
                pickle.dump((key, ver, page.url, page.fetched_at, text), docs,
                            pickle.HIGHEST_PROTOCOL)
                for dest, line in anchor_lines(page, text, task.count, task.live):
                    out = outs.get(dest)
                    if out is None:
                        path = os.path.join(task.tmp, f"lines-{dest}-{task.shard}-"
                                            f"{task.number:06d}")
                        out = outs[dest] = open(path, "wb")  # noqa: SIM115 (closed below)
                        part.lines[dest] = path
                    out.write(line)  # type: ignore[attr-defined]
    finally:
        for out in outs.values():
            out.close()  # type: ignore[attr-defined]
    part.skipped = reader.skipped - skipped
    return part


_worker_reader: CrawlReader | None = None


def _worker_init(data_dir: str) -> None:
    global _worker_reader
    _worker_reader = CrawlReader(data_dir)


def _worker_task(task: Task) -> Part:
    assert _worker_reader is not None
    return read_task(task, _worker_reader)


def tasks(shard: int, keys: np.ndarray, versions: np.ndarray, tmp: str, count: int,
          live: frozenset[int], text_limit: int, chunk: int = CHUNK) -> list[Task]:
    raw = np.ascontiguousarray(keys).tobytes()
    return [Task(n, shard, raw[i * 16:(i + chunk) * 16],
                 tuple(versions[i:i + chunk].tolist()), tmp, count, live, text_limit)
            for n, i in enumerate(range(0, len(versions), chunk))]


def run_tasks(todo: list[Task], reader: CrawlReader, workers: int,
              done: Callable[[Part], None]) -> tuple[list[Part], bool]:
    """Every task, in order; ``done(part)`` after each (progress). In ``workers``
    processes, or here (``reader``) when one is asked or there is one task. Returns the
    parts and whether a pool read them (then ``reader.skipped`` does not count theirs)."""
    if workers <= 1 or len(todo) <= 1:
        parts = []
        for task in todo:
            parts.append(read_task(task, reader))
            done(parts[-1])
        return parts, False
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=context,
                             initializer=_worker_init,
                             initargs=(reader.data_dir,)) as pool:
        parts = []
        try:
            for part in pool.map(_worker_task, todo):
                parts.append(part)
                done(part)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return parts, True


def spilled(paths: list[str]) -> Iterator[Spilled]:
    for path in paths:
        with open(path, "rb") as f:
            while True:
                try:
                    yield pickle.load(f)  # noqa: S301 (our own files, written above)
                except EOFError:
                    break


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


__all__ = ["CHUNK", "Part", "Spilled", "Task", "anchor_lines", "default_workers",
           "indexable", "read_task", "run_tasks", "spilled", "tasks"]
