"""``index`` and ``search`` of a crawl that ran on Ray: each shard's work in an actor on
the node that holds its files, the driver routing anchor text and merging answers.

Theory of operation
-------------------
A Ray crawl's shards live on their nodes' local disks (``DIR/ray.json`` names each
shard's node: docs/RAY.md). ``index --ray ADDRESS`` starts one :class:`ShardIndexer`
actor per shard, pinned to its node, and runs the three phases of
crawler.search.indexer in step over all of them:

1. every actor reads its shard's changed records (in its node's worker processes) and
   returns the anchor lines of its links whose targets other shards own;
2. the driver hands each actor the lines addressed to it, which go into its spill
   like its own;
3. every actor merges its anchors and writes its index, and returns its counts.

So anchor text crosses nodes as it crosses shards in one process, and each index is
what a one-machine ``index`` makes of the same shard (tests/crawler/test_search_ray.py
compares them). A shard whose node is not in the cluster is left out with a warning,
as ``index`` leaves out a shard directory that is not on its machine.

``search --ray ADDRESS`` starts one :class:`ShardSearchActor` per shard and gives the
query to every one at once (crawler.search.query.Searcher with remote shards): each
answers with its best candidates by BM25; the driver blends them with PageRank (the
rank store is the driver's), folds near-duplicates, keeps the best, and asks the
shards that hold them for their snippets. The query is parsed on the driver first,
so a bad one is the same one-line error as without Ray.

Thread safety: a driver is for one thread.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tantivy

from ..exceptions import CrawlerError, DataDirError
from ..net.raycluster import connect, node_id, pinned, shutdown
from ..read.listing import CrawlReader
from ..read.pagetext import DEFAULT_TEXT_LIMIT
from ..state.shards import crawl_count, placement_of, shard_dir
from . import schema
from .indexer import (
    DEFAULT_BATCH,
    DEFAULT_MEMORY,
    MIN_MEMORY,
    IndexStats,
    ShardIndex,
    merge_anchors,
    read_phase,
    write_shard,
)
from .query import (
    DEFAULT_LIMIT,
    DEFAULT_RANK_WEIGHT,
    Candidate,
    Results,
    Searcher,
    ShardSearcher,
    check_query,
)
from .reading import CHUNK, default_workers

log = logging.getLogger(__name__)


def _placement(data_dir: str) -> tuple[int, list[str]]:
    """(shard count, each shard's node address) of a crawl that ran on Ray."""
    count = crawl_count(data_dir)
    nodes = placement_of(data_dir, count)
    if nodes is None:
        raise DataDirError(f"{data_dir}: not a crawl that ran on Ray (no ray.json); "
                           "leave out --ray")
    return count, nodes


def _get(refs: Any) -> Any:
    """ray.get, an actor's failure as one line: a CrawlerError it raised (a shard not on
    its node, a damaged index) keeps its message; anything else, Ray's first line."""
    import ray

    try:
        return ray.get(refs)
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, CrawlerError):
            try:  # its own class (the CLI's exit code follows it), if it takes a message
                again = type(cause)(str(cause))
            except TypeError:
                again = CrawlerError(str(cause))
            raise again from None
        # an actor that died in its constructor: Ray gives the traceback as text
        ours = _OUR_ERROR.findall(str(exc))
        if ours:
            raise CrawlerError(ours[-1].strip().strip("'\"")) from None
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise CrawlerError(f"a shard's actor failed: {lines[-1] if lines else exc!r}") from None


_OUR_ERROR = re.compile(r"crawler\.exceptions\.\w+: ([^\n]+)")


def _actors(data_dir: str, cls: type, *args: Any) -> list[tuple[int, Any]]:
    """(shard, actor of ``cls`` on the shard's node) for every shard whose node is up."""
    import ray

    count, nodes = _placement(data_dir)
    remote: Any = ray.remote(cls)
    out = []
    for shard, node in enumerate(nodes):
        found = node_id(node)
        if found is None:
            log.warning("shard %d: its node %s is not in the cluster; left out", shard, node)
            continue
        out.append((shard, remote.options(
            num_cpus=0, scheduling_strategy=pinned(found)).remote(data_dir, shard, count, *args)))
    if not out:
        raise CrawlerError(f"{data_dir}: no node of the crawl's shards is in the cluster")
    return out


class ShardIndexer:
    """A Ray actor: one shard's part of an ``index`` run, on the shard's node."""

    def __init__(self, data_dir: str, shard: int, count: int, rebuild: bool, text_limit: int,
                 workers: int) -> None:
        self.reader = CrawlReader(data_dir)
        store = self.reader.stores[shard]
        if store is None:
            self.reader.close()
            raise DataDirError(f"{shard_dir(data_dir, shard, count)}: not on this node")
        self.shard, self.count = shard, count
        self.text_limit, self.workers = text_limit, workers or default_workers()
        self.index = ShardIndex(shard, self.reader.dirs[shard], store, rebuild=rebuild)
        self.stats = IndexStats(shards=1, rebuilt=int(self.index.rebuilt))
        self.read_skips = 0

    def read(self) -> dict[int, bytes]:
        """Phase 1: the anchor lines for the other shards, by shard: this run's and any
        a stopped run read and may not have delivered (they stay in this shard's spill
        until its run ends; delivered twice, they merge once)."""
        self.read_skips = read_phase(
            [self.index], self.count, self.stats, self.text_limit, self.workers,
            CHUNK, None, len(self.index.todo_keys), owners=frozenset(range(self.count)))
        out = {}
        for dest, paths in self.index.spill.lines_for_others().items():
            parts = []
            for path in paths:
                with open(path, "rb") as f:
                    parts.append(f.read())
            out[dest] = b"".join(parts)
        return out

    def take(self, chunks: list[tuple[int, bytes]]) -> None:
        """Phase 2's input: the lines other shards' pages have for this one, by the shard
        they came from, into its spill (merged in ``write`` with its own)."""
        for source, data in chunks:
            self.index.spill.add_lines(self.index.spill.take_numbers(1), source, data)

    def write(self, batch: int, memory: int) -> dict[str, Any]:
        """Phases 2 and 3; the shard's counts. The actor is done after it."""
        try:
            merge_anchors(self.index)
            write_shard(self.reader, self.index, self.stats, batch, max(memory, MIN_MEMORY),
                        self.text_limit)
            self.stats.documents = self.index.index.searcher().num_docs
        finally:
            self.index.close()
            self.stats.skipped = self.reader.skipped + self.read_skips
            self.reader.close()
        return dataclasses.asdict(self.stats)


def index_on_ray(data_dir: str, address: str, *, batch: int = DEFAULT_BATCH,
                 memory: int = DEFAULT_MEMORY, rebuild: bool = False,
                 text_limit: int = DEFAULT_TEXT_LIMIT, workers: int = 0) -> IndexStats:
    """``index --ray``: what crawler.search.indexer.index_crawl does, shard by shard on
    the shards' nodes (see the module docstring)."""
    started = time.monotonic()
    _placement(data_dir)  # a crawl that did not run on Ray: one line, before connecting
    connect(address, quiet=True)
    try:
        actors = _actors(data_dir, ShardIndexer, rebuild, text_limit, workers)
        log.info("indexing %d shard(s) on their nodes", len(actors))
        outgoing = _get([a.read.remote() for _, a in actors])
        inbox: dict[int, list[tuple[int, bytes]]] = {shard: [] for shard, _ in actors}
        for (source, _), lines in zip(actors, outgoing, strict=True):
            for dest, data in lines.items():
                if dest in inbox and data:
                    inbox[dest].append((source, data))
        _get([a.take.remote(inbox[shard]) for shard, a in actors])
        counts = _get([a.write.remote(batch, memory) for _, a in actors])
    finally:
        shutdown()
    total = IndexStats()
    for c in counts:
        for name, value in c.items():
            setattr(total, name, getattr(total, name) + value)
    total.seconds = time.monotonic() - started
    log.info("%s", total.summary())
    return total


class ShardSearchActor:
    """A Ray actor: one shard's index, asked for candidates and snippets."""

    def __init__(self, data_dir: str, shard: int, count: int, fields: Sequence[str],
                 boosts: Mapping[str, float] | None, stemmed: bool) -> None:
        index = schema.open_index(schema.search_dir(shard_dir(data_dir, shard, count)),
                                  create=False)
        if index is None:
            raise DataDirError(f"{shard_dir(data_dir, shard, count)}: no search index; make "
                               f"one with: python -m crawler index {data_dir} --ray ...")
        self.searcher = ShardSearcher(index, fields=fields, boosts=boosts, stemmed=stemmed)

    def candidates(self, text: str, host: str | None, lang: str | None,
                   n: int, any_word: bool = False) -> tuple[int, list[Candidate]]:
        return self.searcher.candidates(text, host, lang, n, any_word)

    def snippets(self, text: str, host: str | None, lang: str | None,
                 numbers: list[int]) -> list[tuple[str, list[tuple[int, int]]]]:
        return self.searcher.snippets(text, host, lang, numbers)


class _Remote:
    """A shard asked through its actor: each ``ask_*`` sends at once and gives a function
    that waits for the answer (so every shard works at the same time)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def ask_candidates(self, *args: Any) -> Callable[[], Any]:
        ref = self.actor.candidates.remote(*args)
        return lambda: _get(ref)

    def ask_snippets(self, *args: Any) -> Callable[[], Any]:
        ref = self.actor.snippets.remote(*args)
        return lambda: _get(ref)


class RaySearcher(Searcher):
    """A Searcher over a Ray crawl's shard actors (see the module docstring)."""

    def __init__(self, data_dir: str, address: str, *,
                 rank_weight: float = DEFAULT_RANK_WEIGHT,
                 fields: Sequence[str] = schema.QUERY_FIELDS,
                 boosts: Mapping[str, float] | None = None, stemmed: bool = True) -> None:
        _placement(data_dir)
        # the driver's own parse of each query, on an empty index in memory: a bad query
        # is one line here, not an actor's traceback
        blank = tantivy.Index(schema.build_schema())
        self.checker = ShardSearcher(schema.register(blank), fields=fields, boosts=boosts,
                                     stemmed=stemmed)
        connect(address, quiet=True)
        try:
            actors = _actors(data_dir, ShardSearchActor, list(fields),
                             dict(boosts) if boosts else None, stemmed)
            super().__init__(data_dir, rank_weight=rank_weight,
                             shards=[(shard, _Remote(a)) for shard, a in actors])
        except BaseException:
            shutdown()
            raise

    def search(self, text: str, *, limit: int = DEFAULT_LIMIT, host: str | None = None,
               lang: str | None = None) -> Results:
        self.checker.parse(check_query(text), host, lang)
        return super().search(text, limit=limit, host=host, lang=lang)

    def close(self) -> None:
        try:
            super().close()
        finally:
            shutdown()


__all__ = ["RaySearcher", "ShardIndexer", "ShardSearchActor", "index_on_ray"]
