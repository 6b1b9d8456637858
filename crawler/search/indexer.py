"""``python -m crawler index``: build or bring up to date a crawl's search index, one per
shard, in a streaming pass over MainDB (read-only: it works beside a running crawl).

Theory of operation
-------------------
For each shard, MainDB's snapshot of (key, record version) (``Store.versions()``, in
memory) is compared with what the index has read (crawler.search.versions): only the
records written since are read. Then three phases:

1. *Read* (crawler.search.reading, in worker processes). Each changed record is read
   (in file order) and, when it is an indexable page (status 200, not ``noindex``, a
   text body), read by crawler.read.pagetext. The documents and, for each shard that
   owns link targets, the lines ``target key, text`` of its links with text go to
   files in the shard's spill (crawler.search.spill), kept across runs: a record a
   killed run had read is not read again.
2. *Anchors.* Each shard's lines, sorted, come out grouped by target and are added to
   the shard's anchor store (url_key -> the distinct texts, at most
   :data:`MAX_ANCHOR_BYTES`). A page whose anchor text now differs from the text it was
   indexed with is indexed again, though its own record did not change.
3. *Write.* Those pages first, then the spilled documents, then deletes for keys no
   longer in MainDB, each replacing the key's document (delete by term, add). A commit
   every ``batch`` documents; after each, the versions journal says what it held.

Crash safety: tantivy's commit is atomic, and the journal entry follows the commit; the
spill keeps what was read and not yet committed (crawler.search.spill says in which
order), so a kill -9 anywhere loses at most the task being read or the batch being
written: the next run goes on from there, and the index then equals a clean build. A
record written again after it was read is journaled at the version read, so the next
run reads it again. Anchor text only grows between rebuilds (a link a page no longer
has keeps its text until ``index --rebuild``).

A compaction of MainDB (a new store generation) or a different index format makes the
next run a rebuild. Memory: MainDB's snapshot of keys and versions (24 bytes a record),
the writer's heap (``memory``), the sorters' buffers, a few tasks, and one shard's
anchor store at a time (its key index: ~30 bytes a link target); the version tables
are memory-mapped.

Thread safety: one run per index at a time (the lock file; a second run fails at once).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import tantivy

import kvstore

from ..exceptions import DataDirError
from ..read._linesort import LineSorter
from ..read.htmlbounds import DEFAULT_BOUNDS, ReadBounds
from ..read.listing import CrawlReader
from ..read.pagetext import DEFAULT_TEXT_LIMIT, PageText
from ..state.jsonfile import read_json, write_json
from ..web.urls import host_of, url_key
from . import names, schema
from .reading import CHUNK, default_workers, indexable, run_tasks, tasks
from .spill import Spill, code_percent, read_documents, read_lines
from .versions import GONE, Versions

log = logging.getLogger(__name__)

DEFAULT_BATCH = 5_000  # documents a commit
DEFAULT_MEMORY = 64 << 20  # tantivy's writer heap
MIN_MEMORY = 16 << 20  # tantivy's floor (15 MB a thread), rounded up
MAX_ANCHOR_BYTES = 2048  # anchor text kept a page (UTF-8)
SEPARATOR = " | "
SORT_BUFFER = 16 << 20
REANCHOR_GROUP = 65_536  # anchor targets checked against the index at a time
WRITER_THREAD_MEMORY = 32 << 20  # tantivy's heap a writer thread (at least 15 MB each)
MAX_WRITER_THREADS = 4
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class IndexStats:
    shards: int = 0
    read: int = 0  # records read (changed since the last run)
    indexed: int = 0  # documents written (read, or re-indexed for their anchors)
    reanchored: int = 0  # of which for their anchor text alone
    removed: int = 0  # documents deleted (the page went away, or is no longer indexable)
    documents: int = 0  # documents in the index at the end
    rebuilt: int = 0  # shards rebuilt from nothing
    skipped: int = 0  # damaged records
    # pages indexed from their plain text, not their main content: over the time budget
    # a page (crawler.read.htmlbounds; the index's main-content rule needs no other bound)
    plain: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        plain = (f"; {self.plain:,} read from their plain text (over the time budget a "
                 "page: docs/BOUNDS.md)" if self.plain else "")
        return (f"indexed {self.indexed:,} pages ({self.read:,} records read, "
                f"{self.reanchored:,} for new anchor text), removed {self.removed:,}; "
                f"{self.documents:,} documents in {self.shards} shard index(es) "
                f"({self.seconds:.1f} s){plain}")


NO_DOCUMENT = -1  # the anchor hash of a key read and not indexed (an error page...)


def anchor_hash(text: str) -> int:
    """A 63-bit hash of a page's anchor text (0 for none): what the versions table keeps
    of a page it indexed."""
    if not text:
        return 0
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(),
                          "little") >> 1


def merge_anchor_text(old: str, new: list[str]) -> str:
    """``old`` (texts joined by SEPARATOR) with the texts of ``new`` added: distinct,
    sorted, at most MAX_ANCHOR_BYTES."""
    texts = sorted({t for t in old.split(SEPARATOR) if t} | set(new))
    out: list[str] = []
    size = 0
    for t in texts:
        n = len(t.encode("utf-8")) + len(SEPARATOR)
        if size + n > MAX_ANCHOR_BYTES:
            break
        out.append(t)
        size += n
    return SEPARATOR.join(out)


def document(url: str, fetched_at: float, text: PageText, anchors: str) -> tantivy.Document:
    doc = tantivy.Document()
    for name, value in (("key", url_key(url).hex()), ("url", url), ("host", host_of(url)),
                        ("title", text.title), ("description", text.description),
                        ("headings", text.headings), ("body", text.text),
                        ("anchors", anchors), ("lang", text.lang),
                        ("canonical", text.canonical)):
        doc.add_text(name, value)
    if text.names:  # the names it defines weigh as its headings (FORMAT 4), and whole
        doc.add_text("headings", text.names)
        doc.add_text("names", " ".join(names.terms(text.names)))
    stem = schema.stem_field(text.lang)
    if stem is not None:
        doc.add_text(stem, f"{text.title}\n{text.headings}\n{text.text}")
    doc.add_unsigned("simhash", text.simhash)  # (keyword arguments would make it i64)
    doc.add_unsigned("code", code_percent(text.code))
    doc.add_float("fetched", float(fetched_at))
    return doc


class _Lock:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise DataDirError(f"{os.path.dirname(path)}: another index run is writing this "
                               "index; wait for it to end") from None

    def release(self) -> None:
        os.close(self.fd)


class ShardIndex:
    """One shard's index while a run updates it."""

    def __init__(self, shard: int, shard_dir: str, store: kvstore.Store, *,
                 rebuild: bool) -> None:
        self.shard, self.store = shard, store
        self.dir = schema.search_dir(shard_dir)
        os.makedirs(self.dir, exist_ok=True)
        self.lock = _Lock(os.path.join(self.dir, schema.LOCK))
        try:
            self._open(shard, store, rebuild)
        except BaseException:  # a damaged file (one line): nothing held, the lock let go
            for name in ("versions", "spill"):  # (whichever was opened)
                part: Versions | Spill | None = getattr(self, name, None)
                if part is not None:
                    part.close()
            self.lock.release()
            raise

    def _open(self, shard: int, store: kvstore.Store, rebuild: bool) -> None:
        self.generation, keys, vers = store.versions()
        state_path = os.path.join(self.dir, schema.STATE)
        # (not read for a rebuild: a damaged one is what --rebuild is for)
        state = (read_json(state_path, "search index state", schema.REBUILD)
                 if os.path.exists(state_path) and not rebuild else None)
        self.rebuilt = (rebuild or not isinstance(state, dict)
                        or state.get("format") != schema.FORMAT
                        or state.get("generation") != self.generation
                        # its versions without the index they describe: start again
                        or not schema.index_exists(self.dir))
        if self.rebuilt:
            self._wipe()
            # said at once, so a run killed later resumes this build, not a new one
            write_json(state_path, {"format": schema.FORMAT, "generation": self.generation})
        self.tmp = os.path.join(self.dir, "tmp")  # the sorter's runs: this run's only
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.makedirs(self.tmp)
        self.versions: Versions = Versions(self.dir)
        self.spill: Spill = Spill(self.dir, shard)
        versions, spill = self.versions, self.spill
        keys_v = np.ascontiguousarray(keys).view("V16").ravel()
        changed = versions.changed(keys_v, vers) & spill.changed(keys_v, vers)
        order = np.argsort(vers[changed], kind="stable")  # file order: sequential reads
        self.todo_keys, self.todo_vers = keys_v[changed][order], vers[changed][order]
        self.gone = versions.gone(keys_v)
        del keys, vers, keys_v, changed, order  # the snapshot: 24 bytes a record
        index = schema.open_index(self.dir, create=True)
        assert index is not None  # (create=True)
        self.index: tantivy.Index = index
        self._anchors: kvstore.Store | None = None
        self.sorter = LineSorter(self.tmp, buffer_bytes=SORT_BUFFER)

    @property
    def anchors(self) -> kvstore.Store:
        """The shard's anchor store (url_key -> anchor text), opened when first used.
        Its key index is ~0.8 GB a shard at 20M pages (targets not fetched yet
        included): a run holds one shard's at a time (close_anchors after each phase),
        and none while it reads."""
        if self._anchors is None:
            self._anchors = kvstore.open(os.path.join(self.dir, schema.ANCHORS_DIR))
        return self._anchors

    def close_anchors(self) -> None:
        if self._anchors is not None:
            anchors, self._anchors = self._anchors, None
            anchors.close()

    def _wipe(self) -> None:
        for name in os.listdir(self.dir):
            if name != schema.LOCK:
                path = os.path.join(self.dir, name)
                if os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)

    def anchor_text(self, key: bytes) -> str:
        value = self.anchors.get(key)
        return "" if value is None else value.decode("utf-8")

    def close(self) -> None:
        self.close_anchors()
        self.versions.close()
        self.spill.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.lock.release()


def index_crawl(data_dir: str, *, batch: int = DEFAULT_BATCH, memory: int = DEFAULT_MEMORY,
                rebuild: bool = False, text_limit: int = DEFAULT_TEXT_LIMIT,
                workers: int = 0, chunk: int = CHUNK,
                progress: Progress | None = None,
                bounds: ReadBounds = DEFAULT_BOUNDS) -> IndexStats:
    """Bring the search index of the crawl in ``data_dir`` up to date (see the module
    docstring); returns what was done. ``workers``: processes reading pages (0: one a
    CPU this process may run on); ``chunk``: records a worker's task; ``bounds``: what
    reading a page may cost before it is read from its plain text. The workers are
    started with ``spawn``: a script that calls this with more than one worker needs
    the usual ``if __name__ == "__main__":`` guard (multiprocessing's rule)."""
    started = time.monotonic()
    stats = IndexStats()
    with CrawlReader(data_dir) as reader:
        count = len(reader.stores)
        shards: list[ShardIndex | None] = []
        try:
            for i, store in enumerate(reader.stores):
                shards.append(None if store is None else
                              ShardIndex(i, reader.dirs[i], store, rebuild=rebuild))
            live = [s for s in shards if s is not None]
            stats.shards = len(live)
            stats.rebuilt = sum(1 for s in live if s.rebuilt)
            total = sum(len(s.todo_keys) for s in live)
            for s in live:
                log.info("shard %d: %s records to read, %s gone%s%s", s.shard,
                         f"{len(s.todo_keys):,}", f"{len(s.gone):,}",
                         f", {len(s.spill):,} read by an earlier run" if len(s.spill) else "",
                         " (rebuilding)" if s.rebuilt else "")
            read_skips = read_phase(live, count, stats, text_limit,
                                    workers or default_workers(), chunk, progress, total,
                                    bounds=bounds)
            for s in live:  # 2. anchors
                merge_anchors(s)
                s.close_anchors()
            for s in live:  # 3. write
                write_shard(reader, s, stats, batch, max(memory, MIN_MEMORY), text_limit,
                            bounds=bounds)
                s.close_anchors()
            stats.documents = sum(s.index.searcher().num_docs for s in live)
        finally:
            for shard in shards:
                if shard is not None:
                    shard.close()
        stats.skipped = reader.skipped + read_skips
    stats.seconds = time.monotonic() - started
    log.info("%s", stats.summary())
    return stats


def read_phase(live: list[ShardIndex], count: int, stats: IndexStats, text_limit: int,
               workers: int, chunk: int, progress: Progress | None, total: int, *,
               owners: frozenset[int] | None = None,
               bounds: ReadBounds = DEFAULT_BOUNDS) -> int:
    """Phase 1 (crawler.search.reading) for every shard of ``live``: their documents and
    anchor lines go to their spills; the lines for the shards of ``owners`` (default:
    ``live``'s) that are not ``live`` (on Ray: other nodes' shards) stay in the reading
    shard's spill (``Spill.lines_for_others``). Returns the damaged records skipped."""
    owners = owners if owners is not None else frozenset(s.shard for s in live)
    by_shard = {s.shard: s for s in live}
    todo = (t for s in live for t in tasks(
        s.shard, s.todo_keys, s.todo_vers, s.spill.dir, count, owners, text_limit, chunk,
        first=s.spill.take_numbers(-(-len(s.todo_keys) // chunk)), bounds=bounds))
    done = skipped = 0
    stores = {s.shard: (s.store.path, s.generation) for s in live}
    for task, part in run_tasks(todo, stores, workers):
        stats.read += part.read
        stats.plain += part.plain
        skipped += part.skipped
        for dest, path in part.lines.items():
            if dest in by_shard and dest != task.shard:
                by_shard[dest].spill.adopt(path)
        # its files are durable: the next run does not read these records again
        by_shard[task.shard].spill.record(task.keys, task.versions)
        done += part.read
        if progress is not None:
            progress(done, total)
    return skipped


def merge_anchors(s: ShardIndex) -> None:
    """Phase 2 for one shard: anchor lines into its anchor store; the pages whose
    anchor text now differs from what they were indexed with go to the spill's list of
    pages to index again."""
    lines = s.spill.lines()
    log.info("shard %d: merging the anchor text of %s files of links", s.shard,
             f"{len(lines):,}")  # (minutes at millions of pages: say what is going on)
    for path in lines:
        for line in read_lines(path):
            s.sorter.add(line)
    stale: list[bytes] = []
    group: list[tuple[bytes, int]] = []
    for key, texts in _grouped(s.sorter.sorted()):
        old = s.anchor_text(key)
        text = merge_anchor_text(old, texts)
        if text != old:
            s.anchors[key] = text.encode("utf-8")
        group.append((key, anchor_hash(text)))
        if len(group) >= REANCHOR_GROUP:
            stale += _indexed_with_other_anchors(s, group)
            group = []
    stale += _indexed_with_other_anchors(s, group)
    s.anchors.flush()
    log.info("shard %d: %s links merged; %s pages to index again for their anchor text",
             s.shard, f"{s.sorter.lines:,}", f"{len(stale):,}")
    s.spill.add_reanchor(stale)  # durable before the lines go (see crawler.search.spill)
    for path in lines:
        os.remove(path)


def _indexed_with_other_anchors(s: ShardIndex, group: list[tuple[bytes, int]]) -> list[bytes]:
    """Of (key, hash of its anchor text now), the keys indexed with another text and not
    written in this run anyway (in a spilled file, written with the text they have
    then)."""
    if not group:
        return []
    keys = np.frombuffer(b"".join(k for k, _ in group), dtype="V16")
    hashes = np.array([h for _, h in group], dtype=np.int64)
    indexed_ver, indexed = s.versions.lookup(keys)
    # spilled at a version the index does not hold: its file is still there (a file goes
    # only once the index journaled every version in it)
    spilled_ver = s.spill.spilled.lookup(keys)[0]
    waiting = (spilled_ver >= 0) & (spilled_ver != indexed_ver)
    # not in MainDB: not fetched yet (or gone): indexed with its text once it is
    stale = ((indexed >= 0) & (indexed != hashes) & ~waiting & s.store.contains_many(keys))
    return [group[i][0] for i in np.flatnonzero(stale).tolist()]


def _grouped(lines: Iterator[bytes]) -> Iterator[tuple[bytes, list[str]]]:
    key, texts = b"", list[str]()
    for line in lines:
        hex_key, _, text = line.rstrip(b"\n").partition(b"\t")
        if hex_key != key:
            if texts:
                yield bytes.fromhex(key.decode("ascii")), texts
            key, texts = hex_key, []
        texts.append(text.decode("utf-8"))
    if texts:
        yield bytes.fromhex(key.decode("ascii")), texts


def write_shard(reader: CrawlReader, s: ShardIndex, stats: IndexStats, batch: int,
                 memory: int, text_limit: int, *, bounds: ReadBounds = DEFAULT_BOUNDS) -> None:
    # tantivy's indexing threads share the heap; two instead of one took 7% off a run
    # of 1,699 real pages here (docs/PERFORMANCE.md)
    threads = max(1, min(default_workers(), memory // WRITER_THREAD_MEMORY,
                         MAX_WRITER_THREADS))
    writer = s.index.writer(heap_size=memory, num_threads=threads)
    entries: list[tuple[bytes, int, int]] = []
    written: list[str] = []  # spilled files whose every document is in ``entries``

    def put(key: bytes, ver: int, url: str | None, fetched: float,
            text: PageText | None) -> None:
        writer.delete_documents_by_term("key", key.hex())
        if url is not None and text is not None:
            anchors = s.anchor_text(key)
            ahash = anchor_hash(anchors)
            writer.add_document(document(url, fetched, text, anchors))
            stats.indexed += 1
        else:
            ahash = NO_DOCUMENT
            had = s.versions.lookup(np.frombuffer(key, dtype="V16"))[1][0]
            stats.removed += int(had >= 0)
        entries.append((key, ver, ahash))
        if len(entries) >= batch:
            commit()

    def commit() -> None:
        writer.commit()
        s.versions.record(entries)
        entries.clear()
        for path in written:  # their documents are committed and journaled
            os.remove(path)
        written.clear()

    reanchor, documents = s.spill.reanchor(), s.spill.documents()
    log.info("shard %d: writing %s pages again for their anchor text, %s files of pages "
             "read", s.shard, f"{len(reanchor):,}", f"{len(documents):,}")
    for key in reanchor:  # first: see the module docstring
        ver = _current(s, key)  # before the read: a write between is read next run
        page = reader.load(s.shard, key) if ver >= 0 else None
        text = None if page is None else indexable(page, text_limit, bounds)
        stats.reanchored += text is not None
        stats.plain += text is not None and bool(text.plain)
        put(key, ver if page is not None else GONE, page.url if page is not None else None,
            page.fetched_at if page is not None else 0.0, text)
    for path in documents:
        # a record written again since it was read is journaled at the version read:
        # the next run reads it again (and a later file of this spill may hold it)
        for doc in read_documents(path):
            put(*doc)
        written.append(path)
    for key_v in s.gone.tolist():
        put(bytes(key_v), GONE, None, 0.0, None)
    commit()
    s.versions.checkpoint()
    s.spill.clear()
    writer.wait_merging_threads()
    s.index.reload()


def _current(s: ShardIndex, key: bytes) -> int:
    """MainDB's version of ``key`` now (-1: none); 0 after a compaction since the run
    began: versions of another generation say nothing (the next run rebuilds)."""
    gen, vers = s.store.versions_of(np.frombuffer(key, dtype="V16"))
    return int(vers[0]) if gen == s.generation else 0


__all__ = ["DEFAULT_BATCH", "DEFAULT_MEMORY", "IndexStats", "ShardIndex", "anchor_hash",
           "index_crawl", "merge_anchor_text", "merge_anchors", "read_phase", "write_shard"]
