"""Phase 1 of an index run (crawler.search.indexer): read the changed records and what
their pages say, in worker processes.

Reading a page (resiliparse's parse and main-content extraction, the SimHash, the
links) is CPU work that holds the GIL in part, so a run spreads it over processes: the
records to read, in file order, are cut into tasks of :data:`CHUNK`; each worker opens
the crawl read-only once and, for each task, writes two kinds of files into the shard's
spill (crawler.search.spill): the *documents* (one pickled tuple per record, what phase
3 adds to the index; a record that is not an indexable page is there too, so its
version is journaled) and, per shard owning the targets, the *anchor lines* of its links
(``target key hex, TAB, text``). Tasks are made as they are handed out and at most
:data:`IN_FLIGHT` a worker wait, so the caller's memory does not grow with the crawl;
results come back in task order, so the documents are written to the index in file
order whatever finished first. Small runs (one task) and ``workers=1`` read in the
calling process: same files, no pool.

Thread safety: a task touches only its own files.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..exceptions import URLError
from ..read.listing import CrawlReader
from ..read.pagetext import PageText, page_text
from ..state.pages import NOFOLLOW, PageRecord
from ..state.shards import owner
from ..web.urls import host_of, normalize, url_key
from .spill import documents_file, documents_name, fsync_file, lines_name

CHUNK = 1_000  # records a task
IN_FLIGHT = 4  # tasks handed to a worker process ahead of the one it reads
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
    pooled: bool = False  # read in a worker process (its reader's count is not the caller's)


@dataclass(frozen=True, slots=True)
class Task:
    number: int  # its files' number in the spill
    shard: int
    keys: bytes  # the records' keys, 16 bytes each, in file order
    versions: tuple[int, ...]
    spill: str  # the shard's spill directory
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
    """Read a task's records into its files; every file is durable when this returns."""
    part = Part(os.path.join(task.spill, documents_name(task.shard, task.number)))
    outs: dict[int, object] = {}
    skipped = reader.skipped
    try:
        with documents_file(part.documents) as dump:
            for i, ver in enumerate(task.versions):
                key = task.keys[i * 16:(i + 1) * 16]
                page = reader.load(task.shard, key)
                part.read += 1
                text = None if page is None else indexable(page, task.text_limit)
                if page is None or text is None:
                    dump((key, ver, None, 0.0, None))
                    continue
                dump((key, ver, page.url, page.fetched_at, text))
                for dest, line in anchor_lines(page, text, task.count, task.live):
                    out = outs.get(dest)
                    if out is None:
                        path = os.path.join(task.spill, lines_name(dest, task.shard,
                                                                   task.number))
                        out = outs[dest] = open(path, "wb")  # noqa: SIM115 (closed below)
                        part.lines[dest] = path
                    out.write(line)  # type: ignore[attr-defined]
    finally:
        for out in outs.values():
            out.close()  # type: ignore[attr-defined]
    for path in part.lines.values():
        fsync_file(path)
    part.skipped = reader.skipped - skipped
    return part


_worker_reader: CrawlReader | None = None


def _worker_init(data_dir: str) -> None:
    global _worker_reader
    _worker_reader = CrawlReader(data_dir)


def _worker_task(task: Task) -> Part:
    assert _worker_reader is not None
    part = read_task(task, _worker_reader)
    part.pooled = True
    return part


def tasks(shard: int, keys: np.ndarray, versions: np.ndarray, spill: str, count: int,
          live: frozenset[int], text_limit: int, chunk: int = CHUNK,
          first: int = 0) -> Iterator[Task]:
    """The tasks reading ``keys`` (V16, in file order), numbered from ``first``; made
    one at a time as they are asked for."""
    for n, i in enumerate(range(0, len(versions), chunk)):
        yield Task(first + n, shard, np.ascontiguousarray(keys[i:i + chunk]).tobytes(),
                   tuple(versions[i:i + chunk].tolist()), spill, count, live, text_limit)


def run_tasks(todo: Iterable[Task], reader: CrawlReader,
              workers: int) -> Iterator[tuple[Task, Part]]:
    """Every task and what it made, in order, as each is done. In ``workers``
    processes, or here (``reader``) when one is asked or there is one task."""
    todo = iter(todo)
    head = list(itertools.islice(todo, 2))
    if workers <= 1 or len(head) <= 1:
        for task in itertools.chain(head, todo):
            yield task, read_task(task, reader)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=context,
                             initializer=_worker_init,
                             initargs=(reader.data_dir,)) as pool:
        waiting: deque[tuple[Task, Future[Part]]] = deque()
        try:
            for task in itertools.chain(head, todo):
                waiting.append((task, pool.submit(_worker_task, task)))
                if len(waiting) >= workers * IN_FLIGHT:
                    done, future = waiting.popleft()
                    yield done, future.result()
            while waiting:
                done, future = waiting.popleft()
                yield done, future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


__all__ = ["CHUNK", "IN_FLIGHT", "Part", "Spilled", "Task", "anchor_lines", "default_workers",
           "indexable", "read_task", "run_tasks", "tasks"]
