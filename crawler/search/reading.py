"""Phase 1 of an index run (crawler.search.indexer): read the changed records and what
their pages say, in worker processes.

Reading a page (resiliparse's parse and main-content extraction, the SimHash, the
links) is CPU work that holds the GIL in part, so a run spreads it over processes: the
records to read, in file order, are cut into tasks of :data:`CHUNK`; each worker reads
them at the versions MainDB's snapshot gave (VersionPages: no key index in a worker)
and, for each task, writes two kinds of files into the shard's
spill (crawler.search.spill): the *documents* (one record each, our own format, what
phase 3 adds to the index; a record that is not an indexable page is there too, so its
version is journaled) and, per shard owning the targets, the *anchor lines* of its links
(``target key hex, TAB, text``). Tasks are made as they are handed out and at most
:data:`IN_FLIGHT` a worker wait, so the caller's memory does not grow with the crawl;
results come back in task order, so the documents are written to the index in file
order whatever finished first. Small runs (one task) and ``workers=1`` read in the
calling process: same files, no pool.

Thread safety: a task touches only its own files.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

import kvstore

from ..exceptions import DataDirError, URLError
from ..read.htmlbounds import DEFAULT_BOUNDS, ReadBounds
from ..read.listing import load_record
from ..read.pagetext import PageText, page_text
from ..state.pages import NOFOLLOW, PageRecord, decode_page
from ..state.shards import owner
from ..web.urls import host_of, normalize, url_key
from .spill import documents_name, encode_document, lines_name, write_documents, write_file

CHUNK = 1_000  # records a task
IN_FLIGHT = 4  # tasks handed to a worker process ahead of the one it reads


@dataclass(slots=True)
class Part:
    """What one task made."""

    documents: str
    lines: dict[int, str] = field(default_factory=dict)  # owning shard -> its lines file
    read: int = 0
    skipped: int = 0  # damaged records
    plain: int = 0  # pages read from their plain text (crawler.read.htmlbounds)


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
    bounds: ReadBounds = DEFAULT_BOUNDS


def indexable(page: PageRecord, text_limit: int,
              bounds: ReadBounds = DEFAULT_BOUNDS) -> PageText | None:
    """What the index reads from ``page``; None when it is not indexed: an error, a
    redirect, ``noindex``, no text body. (A revisit's record carries the earlier fetch's
    body: it is indexed.) Read within ``bounds``: past them from its plain text
    (``PageText.plain``)."""
    if page.status != 200 or page.noindex or not page.body:
        return None
    text = page_text(page, text_limit=text_limit, bounds=bounds)
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
    owners: dict[str, int] = {}  # host -> its shard: a page's links share few hosts
    # href without its fragment -> (key, owning shard), None when not a page: a fragment
    # names a place in the same page (WHATWG: from the first "#"), and a third of a
    # manual's links are "#name" or repeat a target
    targets: dict[str, tuple[bytes, int] | None] = {}
    for href, words in text.links:
        bare = href.partition("#")[0]
        if bare in targets:
            found = targets[bare]
        else:
            found = targets[bare] = _target(bare, base, count, owners)
        if found is None:
            continue  # another scheme, a bad host, too long: not a page of a crawl
        key, dest = found
        if key != own and key not in nofollow and dest in live:
            yield dest, key.hex().encode("ascii") + b"\t" + words.encode("utf-8") + b"\n"


def _target(href: str, base: str, count: int,
            owners: dict[str, int]) -> tuple[bytes, int] | None:
    """(key, owning shard) of the page ``href`` names from ``base``; None: not a page."""
    try:
        target = normalize(href, base)
    except URLError:
        return None
    if count <= 1:
        return url_key(target), 0
    host = host_of(target)
    dest = owners.get(host, -1)
    if dest < 0:
        dest = owners[host] = owner(host, count)
    return url_key(target), dest


class VersionPages:
    """Page records by (shard, key, version): MainDB's files read at the versions a
    snapshot gave (kvstore.VersionReader), with no key index in memory, which opening
    MainDB would load (~0.6 GB a process at 21M pages). ``stores``: shard -> (MainDB's
    path, the snapshot's generation)."""

    def __init__(self, stores: dict[int, tuple[str, int]]) -> None:
        self.readers: dict[int, kvstore.VersionReader] = {}
        self.gone: dict[int, str] = {}  # shard -> why its generation cannot be read
        self.skipped = 0  # damaged records skipped so far
        # opened at once, while the snapshot's files are surely there: a reader holds
        # them through a compaction that comes later (a crawl beside the run)
        for shard, (path, generation) in stores.items():
            try:
                self.readers[shard] = kvstore.VersionReader(path, generation)
            except kvstore.exceptions.StoreNotFoundError:
                self.gone[shard] = (f"{path}: compacted since this index run began; run "
                                    "index again (it rebuilds after a compaction)")

    def load(self, shard: int, key: bytes, version: int) -> PageRecord | None:
        reader = self.readers.get(shard)
        if reader is None:
            raise DataDirError(self.gone[shard])
        page, damaged = load_record(lambda: decode_page(reader.get(key, version)),
                                    reader.path, key, strict=False)
        self.skipped += damaged
        return page

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def read_task(task: Task, pages: VersionPages) -> Part:
    """Read a task's records into its files; every file is durable when this returns."""
    part = Part(os.path.join(task.spill, documents_name(task.shard, task.number)))
    docs: list[bytes] = []
    lines: dict[int, list[bytes]] = {}  # owning shard -> lines
    skipped = pages.skipped
    for i, ver in enumerate(task.versions):
        key = task.keys[i * 16:(i + 1) * 16]
        page = pages.load(task.shard, key, ver)
        part.read += 1
        text = None if page is None else indexable(page, task.text_limit, task.bounds)
        # a document: (key, version, URL, fetch time, what the page says); URL and text
        # are None for a record that is not an indexable page (its version is journaled)
        if page is None or text is None:
            docs.append(encode_document(key, ver, None, 0.0, None))
            continue
        docs.append(encode_document(key, ver, page.url, page.fetched_at, text))
        part.plain += bool(text.plain)
        for dest, line in anchor_lines(page, text, task.count, task.live):
            lines.setdefault(dest, []).append(line)
    write_documents(part.documents, docs)
    for dest, chunk in lines.items():
        part.lines[dest] = os.path.join(task.spill, lines_name(dest, task.shard, task.number))
        write_file(part.lines[dest], chunk)
    part.skipped = pages.skipped - skipped
    return part


_worker_pages: VersionPages | None = None
_STOPS = {signal.SIGINT, signal.SIGTERM}  # what stops a run: blocked while a worker starts


def _worker_init(stores: dict[int, tuple[str, int]]) -> None:
    global _worker_pages
    # Ctrl-C reaches the whole process group: the caller stops the workers (_stop_now),
    # rather than each printing its own KeyboardInterrupt. Blocked since its start
    # (_submit): ignored from here on, one that came meanwhile dropped. SIGTERM, blocked
    # since its start too, keeps its default action: the caller's terminate() ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    _worker_pages = VersionPages(stores)


def _submit(pool: ProcessPoolExecutor, task: Task) -> Future[Part]:
    """``pool.submit`` with SIGINT and SIGTERM held back meanwhile: a worker it starts
    inherits the blocked mask, so a Ctrl-C while the worker imports is no traceback of its
    own; and the KeyboardInterrupt the CLI makes of either cannot cut the start of a
    worker between its spawn and the data it is sent (the worker then printed EOFError's
    traceback). A signal here waits the few microseconds, then reaches this process as
    usual."""
    with _stops_held():
        return pool.submit(_worker_task, task)


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread, and, in the main thread, their Python
    handlers swapped for one that notes them: blocking alone does not hold back a
    process-directed signal another thread takes (tantivy's writer threads, started
    before), whose Python handler still runs in the main thread at its next bytecode.
    What came meanwhile is raised again, once each, when the block ends."""
    came: list[int] = []

    def note(signum: int, _frame: object) -> None:
        if signum not in came:
            came.append(signum)

    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    old_handlers = {}
    if threading.current_thread() is threading.main_thread():  # else signal.signal fails
        for signum in _STOPS:
            handler = signal.getsignal(signum)
            if handler is not None:  # None: set outside Python, could not be put back
                old_handlers[signum] = handler
                signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for got in came:
            signal.raise_signal(got)


def _stop_now(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool``'s workers at once, their tasks cut short: a Ctrl-C or SIGTERM ends
    the run within a second rather than after the tasks under way (each up to
    :data:`CHUNK` pages). What they were writing is a ``.tmp`` the next run removes, and
    their records are read again then, as after a kill -9."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    # before 3.14 the executor has no public way: its worker processes, by hand
    processes = getattr(pool, "_processes", None) or {}
    for proc in list(processes.values()):
        proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _worker_task(task: Task) -> Part:
    assert _worker_pages is not None
    return read_task(task, _worker_pages)


def tasks(shard: int, keys: np.ndarray, versions: np.ndarray, spill: str, count: int,
          live: frozenset[int], text_limit: int, chunk: int = CHUNK,
          first: int = 0, bounds: ReadBounds = DEFAULT_BOUNDS) -> Iterator[Task]:
    """The tasks reading ``keys`` (V16, in file order), numbered from ``first``; made
    one at a time as they are asked for."""
    for n, i in enumerate(range(0, len(versions), chunk)):
        yield Task(first + n, shard, np.ascontiguousarray(keys[i:i + chunk]).tobytes(),
                   tuple(versions[i:i + chunk].tolist()), spill, count, live, text_limit,
                   bounds)


def run_tasks(todo: Iterable[Task], stores: dict[int, tuple[str, int]],
              workers: int) -> Iterator[tuple[Task, Part]]:
    """Every task and what it made, in order, as each is done. In ``workers``
    processes, or here when one is asked or there is one task. ``stores``: as
    VersionPages takes them."""
    todo = iter(todo)
    head = list(itertools.islice(todo, 2))
    if workers <= 1 or len(head) <= 1:
        pages = VersionPages(stores)
        try:
            for task in itertools.chain(head, todo):
                yield task, read_task(task, pages)
        finally:
            pages.close()
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=context,
                             initializer=_worker_init, initargs=(stores,)) as pool:
        waiting: deque[tuple[Task, Future[Part]]] = deque()
        try:
            for task in itertools.chain(head, todo):
                waiting.append((task, _submit(pool, task)))
                if len(waiting) >= workers * IN_FLIGHT:
                    done, future = waiting.popleft()
                    yield done, future.result()
            while waiting:
                done, future = waiting.popleft()
                yield done, future.result()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into it by the CLI
            _stop_now(pool)
            raise
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)))


__all__ = ["CHUNK", "IN_FLIGHT", "Part", "Task", "anchor_lines", "default_workers",
           "indexable", "read_task", "run_tasks", "tasks", "VersionPages"]
