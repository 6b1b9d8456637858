"""PageRank over the crawl's link graph, out of core; the rank store it leaves in ``DIR/rank``.

Theory of operation
-------------------
The graph (crawler.read.graph) has a node per record; the PageRank nodes are
the ``N`` records with an HTTP answer (status > 0: pages, redirects, 4xx and
5xx answers). Its edges are the followable links between them:

- a link marked nofollow passes nothing (as search engines treat it);
- a link to a URL that was not fetched (no record, or a record without an
  answer: off scope, robots-disallowed, a dead host) is *dropped*, not kept as
  a dangling node: such URLs are often many times the fetched pages, and
  each would take an equal share of the teleport and give it back uniformly,
  diluting the fetched pages' ranks by an amount that depends on how much of
  the web the scope cut off. The out-degree counts the kept edges only;
- a redirect is a node whose one edge goes to its target, so all the rank it
  passes goes there (a chain passes it hop by hop);
- a fetched page with no kept edge out (an error page, a non-HTML page, a
  leaf) is dangling: its rank is spread over all N pages, as is the teleport.

With damping ``d``, each iteration computes, from ``x`` (sum 1)::

    x'[v] = d * sum(x[u] / outdeg[u] for u -> v) + (d * D + 1 - d) / N

where ``D`` is the rank of the dangling pages; it stops when the L1 change
``sum |x' - x|`` falls below ``tol`` (or after ``max_iter``). This is the
definition networkx.pagerank computes (uniform teleport and dangling
vectors); tests compare the two.

Out of core: ``x``, ``x'`` and ``x / outdeg`` are array files on disk; the
edges are tiles by (target block, source block). For each target block the
accumulator (one block of float64) gathers, tile by tile, one block of
``x / outdeg`` read from disk and the tile's edges read in chunks; then the
new block is written and its L1 change summed. Memory is therefore bounded by
the block and chunk sizes, whatever the graph's size: about ``35 * block +
24 * chunk`` bytes (~80 MB with the defaults), plus the interpreter. A
pass reads every edge once (8 B each) and ``blocks**2`` blocks of values.

The rank store (``DIR/rank/``, written under a temporary name and renamed
into place) keeps the node tables of the graph (keys, statuses, URLs, the
sorted key index with inlink counts), ``rank.f8`` (the raw ranks, by rid),
``order.u8`` (the rids of the fetched pages by rank, highest first: sorted
per block, then merged, in bounded memory) and ``rank.json`` (damping,
tolerance, iterations, final delta, the maximum rank, which scales a raw
value to 0..100 for display: ``100 * rank / max``). The edge tiles are
dropped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..exceptions import ConfigError
from . import _spill
from .graph import DEFAULT_BLOCK_NODES, DEFAULT_CHUNK, Graph, GraphInfo, build

log = logging.getLogger(__name__)

DEFAULT_DAMPING = 0.85
DEFAULT_TOL = 1e-9  # L1 change between iterations (the error left is ~5.7x that)
DEFAULT_MAX_ITER = 200
RANK_DIR = "rank"
RANK_META = "rank.json"
_RUN = np.dtype([("neg", "<f8"), ("rid", "<i8")])  # a sorted run: -rank, rid


@dataclass
class RankResult:
    damping: float = DEFAULT_DAMPING
    tol: float = DEFAULT_TOL
    iterations: int = 0
    delta: float = 0.0  # L1 change of the last iteration
    converged: bool = True
    max_rank: float = 0.0
    seconds: float = 0.0  # iterations only
    seconds_per_iteration: float = 0.0
    graph: dict[str, Any] = field(default_factory=dict)
    records: int = 0  # records the crawl had when the ranks were computed
    built_at: float = 0.0


def pagerank(graph: Graph, *, damping: float = DEFAULT_DAMPING, tol: float = DEFAULT_TOL,
             max_iter: int = DEFAULT_MAX_ITER, chunk: int = DEFAULT_CHUNK,
             progress: Callable[[int, float], None] | None = None) -> RankResult:
    """Iterate to convergence; the ranks end in ``rank.f8`` of the graph directory."""
    if not 0 < damping < 1:
        raise ConfigError(f"damping must be in (0, 1), got {damping}")
    if tol <= 0 or max_iter < 1:
        raise ConfigError("tolerance must be > 0 and max_iter >= 1")
    result = RankResult(damping=damping, tol=tol, graph=asdict(graph.info))
    x_name, y_name, c_name = "x.f8", "y.f8", "c.f8"
    n_fetched = graph.info.fetched
    for name in (x_name, y_name, c_name):
        _spill.create(graph.path(name), np.float64, graph.n)
    if n_fetched == 0:
        os.replace(graph.path(x_name), graph.path("rank.f8"))
        return result
    for b in range(graph.blocks):
        start, _ = graph.block_range(b)
        active = graph.read("status.i2", np.int16, b) > 0
        _spill.write_slice(graph.path(x_name), start, np.where(active, 1.0 / n_fetched, 0.0))
    started = time.monotonic()
    converged = False
    delta = 0.0
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the count is the result
        delta = _iterate(graph, x_name, y_name, c_name, damping, n_fetched, chunk)
        x_name, y_name = y_name, x_name
        if progress is not None:
            progress(it, delta)
        log.debug("pagerank iteration %d: L1 change %.3g", it, delta)
        if delta < tol:
            converged = True
            break
    result.seconds = time.monotonic() - started
    result.iterations, result.delta, result.converged = it, delta, converged
    result.seconds_per_iteration = result.seconds / max(it, 1)
    os.replace(graph.path(x_name), graph.path("rank.f8"))
    for name in (y_name, c_name):
        os.unlink(graph.path(name))
    result.max_rank = max((float(graph.read("rank.f8", np.float64, b).max(initial=0.0))
                           for b in range(graph.blocks)), default=0.0)
    if not converged:
        log.warning("pagerank: not converged after %d iterations (L1 change %.3g > %.3g)",
                    it, delta, tol)
    return result


def _iterate(graph: Graph, x_name: str, y_name: str, c_name: str, d: float, n_fetched: int,
             chunk: int) -> float:
    """One iteration from array ``x_name`` into ``y_name``; returns the L1 change.
    In place where it can: a block costs ~35 B a node at the peak."""
    dangling = 0.0
    for b in range(graph.blocks):
        start, _ = graph.block_range(b)
        x = graph.read(x_name, np.float64, b)
        out = graph.read("outdeg.u4", np.uint32, b)
        active = graph.read("status.i2", np.int16, b) > 0
        dangling += float(x[active & (out == 0)].sum())
        np.divide(x, out, out=x, where=out > 0)
        x[out == 0] = 0.0
        _spill.write_slice(graph.path(c_name), start, x)
        del x, out, active
    base = (d * dangling + 1.0 - d) / n_fetched
    delta = 0.0
    for db in range(graph.blocks):
        start, end = graph.block_range(db)
        acc = np.zeros(end - start, dtype=np.float64)
        for sb in range(graph.blocks):
            if not graph.tile_size(db, sb):
                continue
            c = graph.read(c_name, np.float64, sb)
            for part in graph.tile(db, sb, chunk):
                acc += np.bincount(part["dst"], weights=c[part["src"]], minlength=end - start)
            del c
        acc *= d
        acc += base
        acc[graph.read("status.i2", np.int16, db) <= 0] = 0.0
        _spill.write_slice(graph.path(y_name), start, acc)
        x = graph.read(x_name, np.float64, db)
        np.subtract(acc, x, out=x)
        delta += float(np.abs(x, out=x).sum())
    return delta


def write_order(graph: Graph, chunk: int = DEFAULT_CHUNK) -> None:
    """``order.u8``: the rids of fetched pages by rank, highest first (ties by rid).

    Slices of ``2 * chunk`` nodes are sorted into run files; the runs are merged in
    rounds: every
    run keeps a buffer of ``chunk / runs`` items, and a round writes out, sorted,
    everything up to the smallest last buffered item of the runs still going
    (nothing after it can come before it). Memory: ~``chunk`` items."""
    runs: list[str] = []
    step = 2 * chunk  # a run sorts ~80 B a node
    for start in range(0, graph.n, step):
        count = min(step, graph.n - start)
        active = _spill.read_slice(graph.path("status.i2"), np.int16, start, count) > 0
        rids = np.flatnonzero(active) + start
        neg = -_spill.read_slice(graph.path("rank.f8"), np.float64, start, count)[active]
        order = np.lexsort((rids, neg))
        run = np.empty(len(rids), dtype=_RUN)
        run["neg"], run["rid"] = neg[order], rids[order]
        path = graph.path(f"run-{len(runs):05d}.bin")
        run.tofile(path)
        runs.append(path)
    with open(graph.path("order.u8"), "wb") as out:
        for part in _merge(runs, max(256, chunk // max(len(runs), 1))):
            part["rid"].astype(np.uint64).tofile(out)
    for p in runs:
        os.unlink(p)


def _merge(paths: list[str], size: int) -> Iterator[np.ndarray]:
    """The items of sorted run files, in order, in sorted pieces (see write_order)."""
    files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed below
    try:
        bufs = [np.fromfile(f, dtype=_RUN, count=size) for f in files]
        done = [len(b) < size for b in bufs]  # the run has nothing left beyond its buffer
        while any(len(b) for b in bufs):
            lasts = [b[-1] for b, d in zip(bufs, done, strict=True) if not d]
            last = min(lasts, key=lambda item: (item["neg"], item["rid"])) if lasts else None
            out = []
            for i, b in enumerate(bufs):
                if last is None:
                    cut = len(b)
                else:  # a sorted buffer: the items up to ``last`` are a prefix
                    cut = int(((b["neg"] < last["neg"]) | ((b["neg"] == last["neg"])
                                                           & (b["rid"] <= last["rid"]))).sum())
                out.append(b[:cut])
                bufs[i] = b[cut:]
                if not len(bufs[i]) and not done[i]:
                    bufs[i] = np.fromfile(files[i], dtype=_RUN, count=size)
                    done[i] = len(bufs[i]) < size
            pool = np.concatenate(out)
            yield pool[np.lexsort((pool["rid"], pool["neg"]))]
    finally:
        for f in files:
            f.close()


def rank_crawl(reader: Any, *, damping: float = DEFAULT_DAMPING, tol: float = DEFAULT_TOL,
               max_iter: int = DEFAULT_MAX_ITER, block: int = DEFAULT_BLOCK_NODES,
               chunk: int = DEFAULT_CHUNK, work_dir: str | None = None,
               progress: Callable[[int, float], None] | None = None) -> RankResult:
    """Build the graph of the crawl ``reader`` reads, rank it and store the ranks in
    ``DIR/rank`` (replacing earlier ones). ``work_dir``: an existing directory the graph
    is built in, in a directory of its own there (default: beside the store,
    ``DIR/rank.tmp-PID``); nothing else in it is touched."""
    data_dir = reader.data_dir
    final = os.path.join(data_dir, RANK_DIR)
    if work_dir is not None:
        tmp = tempfile.mkdtemp(prefix=f"{RANK_DIR}.tmp-", dir=work_dir)
    else:
        tmp = os.path.join(data_dir, f"{RANK_DIR}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        records = len(reader)
        t0 = time.monotonic()
        graph = build(reader.pages(with_body=False), tmp, expected=records, block=block,
                      chunk=chunk)
        log.info("graph: %d records, %d fetched, %d rank edges of %d links, %d dangling, in "
                 "%.1f s", graph.info.records, graph.info.fetched, graph.info.edges,
                 graph.info.links, graph.info.dangling, time.monotonic() - t0)
        result = pagerank(graph, damping=damping, tol=tol, max_iter=max_iter, chunk=chunk,
                          progress=progress)
        write_order(graph, chunk)
        graph.remove_edges()
        result.records, result.built_at = records, time.time()
        with open(graph.path(RANK_META), "w", encoding="utf-8") as f:
            json.dump(asdict(result), f)
        old = os.path.join(data_dir, f"{RANK_DIR}.old-{os.getpid()}")
        if os.path.exists(final):
            os.replace(final, old)
        if work_dir is not None and os.path.dirname(os.path.abspath(tmp)) != os.path.abspath(
                data_dir):
            shutil.move(tmp, final)  # another file system maybe
        else:
            os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


__all__ = ["DEFAULT_DAMPING", "DEFAULT_MAX_ITER", "DEFAULT_TOL", "RANK_DIR", "GraphInfo",
           "RankResult", "pagerank", "rank_crawl", "write_order"]
